"""The built-in training corpus: short English-like tales from a small probabilistic grammar (no download).

`generate_corpus(seed=..., n_sentences=...)` is deterministic for a seed (it uses its own `random.Random`, never the
global one) and produces about 1 MB of text for the default 20,000 sentences in a fraction of a second. Tales are
separated by a newline; sentences within a tale by a space. The grammar keeps names, pronouns and verb forms
consistent inside a tale, so a tiny byte-level language model's loss falls clearly while the text stays varied.
"""

from __future__ import annotations

import random

CORPUS_NAME = "fleetyard-tiny-tales"

# name -> (subject pronoun, possessive pronoun)
_NAMES: dict[str, tuple[str, str]] = {
    "Mia": ("she", "her"), "Lily": ("she", "her"), "Zoe": ("she", "her"), "Anna": ("she", "her"),
    "Ivy": ("she", "her"), "Nora": ("she", "her"), "Ruby": ("she", "her"), "Ella": ("she", "her"),
    "Rosa": ("she", "her"), "Maya": ("she", "her"), "Lucy": ("she", "her"), "Hana": ("she", "her"),
    "Tom": ("he", "his"), "Ben": ("he", "his"), "Max": ("he", "his"), "Sam": ("he", "his"),
    "Leo": ("he", "his"), "Finn": ("he", "his"), "Oscar": ("he", "his"), "Jack": ("he", "his"),
    "Omar": ("he", "his"), "Theo": ("he", "his"), "Kai": ("he", "his"), "Hugo": ("he", "his"),
}
_KINDS = ["girl", "boy", "cat", "dog", "rabbit", "fox", "bird", "bear", "mouse", "frog", "dragon", "robot", "owl",
          "duck", "turtle", "squirrel", "horse", "puppy", "kitten", "lion"]
_ADJECTIVES = ["little", "big", "happy", "sleepy", "brave", "shy", "curious", "kind", "clever", "silly", "old",
               "young", "tiny", "gentle", "grumpy", "funny", "quiet", "friendly", "busy", "lazy"]
_PLACES = ["a small village", "the big forest", "a quiet town", "a sunny farm", "the old castle", "a busy city",
           "a house by the sea", "a hut on a tall mountain", "a green valley", "the deep woods", "a little garden",
           "a cozy cottage", "a snowy land", "a nest in a tree", "a hole under the hill"]
_LANDMARKS = ["river", "old tree", "garden", "bridge", "hill", "pond", "school", "market", "cave", "beach", "park",
              "well", "barn", "lake", "fence", "road"]
_LANDMARK_ADJECTIVES = ["old", "big", "little", "quiet", "tall", "dark", "sunny", "far"]
_COLORS = ["red", "blue", "green", "yellow", "shiny", "golden", "purple", "white", "pink", "orange", "brown",
           "silver"]
_OBJECTS = ["ball", "kite", "box", "hat", "book", "key", "apple", "shell", "stone", "flower", "boat", "drum",
            "map", "cake", "lamp", "bell", "feather", "cup", "toy car", "balloon", "coat", "basket", "ring", "sock"]
# (base form, past form)
_ACTIVITIES = [
    ("play in the garden", "played in the garden"), ("run up the hill", "ran up the hill"),
    ("sing songs", "sang songs"), ("read books", "read books"), ("dance in the rain", "danced in the rain"),
    ("watch the stars", "watched the stars"), ("swim in the pond", "swam in the pond"),
    ("climb trees", "climbed trees"), ("bake cookies", "baked cookies"), ("draw pictures", "drew pictures"),
    ("fly a kite", "flew a kite"), ("build a fort", "built a fort"), ("pick berries", "picked berries"),
    ("jump in the leaves", "jumped in the leaves"), ("look for bugs", "looked for bugs"),
    ("play hide and seek", "played hide and seek"), ("ride a bike", "rode a bike"),
]
_FEELINGS = ["happy", "sad", "scared", "excited", "surprised", "proud", "tired", "worried", "glad", "angry",
             "calm", "lonely"]
_TIMES = ["One day", "One morning", "One evening", "Later", "Then", "After a while", "That night", "The next day",
          "Soon", "Suddenly", "In the afternoon"]
_EXCLAIMS = ["Wow", "Oh no", "Look at this", "How pretty", "Yay", "Oh my", "What is that", "Hooray"]
_WEATHER = ["The sun was bright", "It was a cold day", "The wind was strong", "It started to rain",
            "The sky was blue", "Snow fell softly", "The night was dark"]


def _a(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def _cap(text: str) -> str:
    return text[0].upper() + text[1:]


def _kind(rng: random.Random, pronoun: str) -> str:
    kind = rng.choice(_KINDS)
    if kind in ("girl", "boy"):
        return "girl" if pronoun == "she" else "boy"
    return kind


def _tale(rng: random.Random) -> list[str]:
    """One tale: an opening, a middle made of a few events, and an ending."""
    name, name2 = rng.sample(sorted(_NAMES), 2)
    he, his = _NAMES[name]
    he2, _his2 = _NAMES[name2]
    kind, kind2 = _kind(rng, he), _kind(rng, he2)
    adj = rng.choice(_ADJECTIVES)
    place = rng.choice(_PLACES)
    obj = rng.choice(_OBJECTS)
    color = rng.choice(_COLORS)
    landmark = rng.choice(_LANDMARKS)
    if rng.random() < 0.3:
        landmark = f"{rng.choice(_LANDMARK_ADJECTIVES)} {landmark}"
    activity, activity_past = rng.choice(_ACTIVITIES)
    feeling = rng.choice(_FEELINGS)

    opening = rng.choice([
        f"Once upon a time, there was {_a(adj)} {kind} named {name}.",
        f"{name} was {_a(adj)} {kind} who lived in {place}.",
        f"There once lived {_a(adj)} {kind} called {name} in {place}.",
        f"Once upon a time, in {place}, there lived {_a(adj)} {kind} named {name}.",
    ])
    sentences = [opening]
    middle = [
        f"{_cap(he)} loved to {activity}.",
        f"Every day, {name} liked to {activity}.",
        f"{name} had {_a(color)} {obj} that {he} loved very much.",
        f"{rng.choice(_WEATHER)}.",
        f"{rng.choice(_TIMES)}, {name} found {_a(color)} {obj} near the {landmark}.",
        f"{rng.choice(_TIMES)}, {name} met {_a(rng.choice(_ADJECTIVES))} {kind2} named {name2}.",
        f"{rng.choice(_TIMES)}, {name} lost {his} {obj} near the {landmark}.",
        f'"Can you help me find my {obj}?" asked {name}.',
        f'"Let us {activity} together!" said {name2}.',
        f'"{rng.choice(_EXCLAIMS)}!" said {name}.',
        f"{name} felt {feeling}.",
        f"{_cap(he)} was very {feeling}, so {he} went to the {landmark}.",
        f"{name2} said that {he2} wanted to {rng.choice(_ACTIVITIES)[0]} too.",
        f"{name} and {name2} looked everywhere for the {obj}.",
    ]
    # A few events, kept in the grammar's order so that tales read (and are learned) as a story.
    sentences += [middle[i] for i in sorted(rng.sample(range(len(middle)), rng.randint(2, 6)))]
    sentences.append(rng.choice([
        f"They {activity_past} together until the sun went down.",
        f"In the end, {name} and {name2} became best friends.",
        f"From that day on, {name} always kept {his} {obj} close.",
        f"{name} was {feeling} no more, and {he} smiled.",
        f"At last, {name} went home and slept well.",
    ]))
    if rng.random() < 0.5:
        sentences.append("The end.")
    return sentences


def generate_corpus(*, seed: int = 0, n_sentences: int = 20000) -> str:
    """Exactly `n_sentences` sentences of tales, deterministic for `seed` (the last tale may be cut short)."""
    if isinstance(n_sentences, bool) or not isinstance(n_sentences, int) or n_sentences < 0:
        raise ValueError("n_sentences: must be a non-negative integer")
    rng = random.Random(seed)
    tales: list[str] = []
    remaining = n_sentences
    while remaining > 0:
        sentences = _tale(rng)[:remaining]
        remaining -= len(sentences)
        tales.append(" ".join(sentences))
    return "\n".join(tales) + ("\n" if tales else "")


def corpus_bytes(seed: int = 0, n_sentences: int = 20000) -> bytes:
    """The corpus as UTF-8 bytes (what the byte-level tokenizer trains on)."""
    return generate_corpus(seed=seed, n_sentences=n_sentences).encode("utf-8")
