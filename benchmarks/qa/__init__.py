"""The `tracerl bench` library: QA datasets, agents, evaluation, reports and statistics."""
