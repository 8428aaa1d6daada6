"""Invented names: syllable-built people and places, recombined English titles for works.

Names are invented so that no answer can be guessed without retrieval. Person and place names
are built from syllables ("Maththaer Tedailbeirk", "Boharkstad"); film and book titles recombine
English words ("The Burning Thorn", "Canyon of Copper"), so titles overlap in words as real ones
do. Every full name is unique in a world, and single-word stems (places, countries, companies,
family names) never repeat across kinds, so a stem names one thing.

`similarity` is the difficulty knob for look-alike names: with that probability a new stem is
an existing stem of the same kind with one syllable changed ("Boharkstad" → "Bolirkstad").
"""

from __future__ import annotations

from collections.abc import Callable

from envs.synthetic.dice import Dice

__all__ = ["NameMaker"]

_ONSETS = (
    "b", "br", "c", "d", "dr", "f", "g", "gr", "h", "j", "k", "kr", "l", "m", "n",
    "p", "pr", "r", "s", "sh", "st", "t", "th", "tr", "v", "w", "z",
)  # fmt: skip
_NUCLEI = ("a", "e", "i", "o", "u", "ae", "ai", "ei", "ia", "io", "ou")
_CODAS = ("", "", "", "n", "r", "l", "s", "th", "rk", "nd", "m", "x")
_PLACE_SUFFIXES = ("stad", "holm", "mark", "burg", "ford", "wick", "vale", "haven", "gard", "mouth")
_COUNTRY_SUFFIXES = ("ia", "land", "avia", "onia", "stan", "ora", "esh")
_COMPANY_KINDS = (
    "Industries", "Works", "Group", "Holdings", "Systems", "Motors", "Press", "Laboratories",
    "Foods", "Textiles",
)  # fmt: skip
_UNIVERSITY_PATTERNS = (
    "{} University", "University of {}", "{} Institute of Technology", "{} College",
    "{} Polytechnic",
)  # fmt: skip
_ADJECTIVES = (
    "Burning", "Silent", "Crimson", "Hollow", "Broken", "Golden", "Frozen", "Hidden", "Distant",
    "Velvet", "Iron", "Pale", "Wild", "Last", "Quiet", "Bitter", "Endless", "Scarlet", "Silver",
    "Sunken", "Winter", "Northern", "Painted", "Lonely", "Restless", "Shattered", "Forgotten",
    "Electric", "Amber", "Glass",
)  # fmt: skip
_NOUNS = (
    "Thorn", "Canyon", "River", "Harbor", "Mirror", "Garden", "Lantern", "Orchard", "Tide",
    "Crown", "Shadow", "Meadow", "Bridge", "Tower", "Island", "Compass", "Feather", "Valley",
    "Storm", "Letter", "Window", "Engine", "Forest", "Echo", "Horizon", "Voyage", "Promise",
    "Ember", "Circle", "Signal", "Station", "Mountain", "Ocean", "Desert", "Ladder", "Portrait",
    "Summer", "Kingdom", "Frontier", "Anthem", "Copper", "Ash",
)  # fmt: skip
_FILM_PATTERNS = (
    "The {a} {n}", "{n} of {m}", "{a} {n}", "The {n} of the {a} {m}", "Beyond the {n}",
    "A {n} for the {m}",
)  # fmt: skip
_BOOK_PATTERNS = (
    "The {n}'s {m}", "{n}s of the {a} {m}", "A {a} {n}", "The Book of {n}s",
    "Letters from the {n}", "{a} {n}s",
)  # fmt: skip
_GIVEN_SUFFIX = {"m": ("", "o", "an", "ek", "ar"), "f": ("a", "ia", "ine", "el", "ys")}


class NameMaker:
    """Mints unique names for one world.

    Args:
        dice: the random source.
        similarity: probability that a new stem is a one-syllable variant of an existing one.

    >>> maker = NameMaker(Dice(0))
    >>> a, b = maker.place(), maker.place()
    >>> a != b and a[0].isupper()
    True
    """

    def __init__(self, dice: Dice, *, similarity: float = 0.0) -> None:
        self._dice = dice
        self._similarity = similarity
        self._used: set[str] = set()  # lower-cased full names and stems, across kinds
        self._stems: dict[str, list[tuple[str, ...]]] = {}

    def _syllable(self) -> str:
        d = self._dice
        return d.pick(_ONSETS) + d.pick(_NUCLEI) + d.pick(_CODAS)

    def _stem(self, kind: str, n_syllables: tuple[int, int], suffix: str = "") -> str:
        """A fresh capitalised stem (plus suffix) not used before, for one kind of name."""
        stems = self._stems.setdefault(kind, [])
        for _ in range(1000):
            if stems and self._dice.chance(self._similarity):
                syllables = list(self._dice.pick(stems))
                syllables[self._dice.below(len(syllables))] = self._syllable()
            else:
                syllables = [self._syllable() for _ in range(self._dice.between(*n_syllables))]
            word = ("".join(syllables) + suffix).capitalize()
            if 4 <= len(word) <= 16 and word.lower() not in self._used:
                self._used.add(word.lower())
                stems.append(tuple(syllables))
                return word
        raise RuntimeError(f"could not mint a fresh {kind} name in 1000 draws")

    def _unique(self, make: Callable[[], str]) -> str:
        for _ in range(1000):
            name = make()
            if name.lower() not in self._used:
                self._used.add(name.lower())
                return name
        raise RuntimeError("could not mint a fresh title in 1000 draws; lower the world's size")

    def given_name(self, gender: str) -> str:
        """A given name (given names may repeat across people, as real ones do)."""
        return (self._syllable() + self._dice.pick(_GIVEN_SUFFIX[gender])).capitalize()

    def family_name(self) -> str:
        """A fresh family name."""
        return self._stem("family", (2, 3))

    def person(self, gender: str, family: str) -> str:
        """A full name in a family, unique in the world."""
        return self._unique(lambda: f"{self.given_name(gender)} {family}")

    def place(self) -> str:
        """A fresh city name."""
        return self._stem("place", (1, 2), self._dice.pick(_PLACE_SUFFIXES))

    def country(self) -> str:
        """A fresh country name."""
        return self._stem("country", (1, 2), self._dice.pick(_COUNTRY_SUFFIXES))

    def company(self) -> str:
        """A fresh company name."""
        return f"{self._stem('company', (2, 2))} {self._dice.pick(_COMPANY_KINDS)}"

    def university(self) -> str:
        """A fresh university name."""
        return self._dice.pick(_UNIVERSITY_PATTERNS).format(self._stem("university", (2, 2)))

    def event(self) -> str:
        """A fresh stem for an event or prize."""
        return self._stem("event", (2, 2))

    def _title(self, patterns: tuple[str, ...]) -> str:
        d = self._dice
        n = d.pick(_NOUNS)
        m = d.pick([w for w in _NOUNS if w != n])
        return d.pick(patterns).format(a=d.pick(_ADJECTIVES), n=n, m=m)

    def film(self) -> str:
        """A fresh film title."""
        return self._unique(lambda: self._title(_FILM_PATTERNS))

    def book(self) -> str:
        """A fresh book title."""
        return self._unique(lambda: self._title(_BOOK_PATTERNS))
