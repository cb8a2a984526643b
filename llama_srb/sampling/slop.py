"""An example `banned_regex` list a writer can start from: phrase families that small and
large models alike lean on, one pattern per family (written for this project; docs/api.md
shows it). Each family is matched case-insensitively, with a curly or straight apostrophe.
Trim it to taste: a pattern bans its whole family, including a use a writer might want.
"""

from __future__ import annotations

EXAMPLE_SLOP_PATTERNS: tuple[str, ...] = (
    # her knuckles whitened / knuckles turning white / his knuckles were white
    r"\bknuckles\b[^.!?\n]{0,24}\bwhit(?:e|ened|ening)\b",
    # not X, but Y / not just a game, but a way of life
    r"\bnot (?:just |only |merely |simply )?(?:\w+ ){0,3}\w+, but\b",
    # a mix of fear and excitement / a mixture of awe and dread / a blend of
    r"\ba (?:mix|mixture|blend) of (?:\w+ ){0,2}\w+ and\b",
    # shivers down her spine / a shiver ran down his spine
    r"\bshivers? (?:\w+ ){0,2}(?:up and )?down (?:\w+ )?spine\b",
    # barely above a whisper / little more than a whisper
    r"\b(?:barely|scarcely|little more) (?:above|than) a whisper\b",
    # eyes sparkling with mischief / eyes glinting with amusement
    r"\beyes (?:\w+ )?(?:sparkl|glint|twinkl|gleam)\w* with (?:mischief|amusement|mirth)\b",
    # a testament to / a stark testament to
    r"\ba (?:stark |true |living )?testament to\b",
    # couldn't help but / could not help but
    r"\b(?:couldn’t|couldn't|could not|can’t|can't|cannot) help but\b",
    # a breath she didn't know she was holding
    r"\bbreath (?:\w+ )?(?:didn’t|didn't|did not) (?:even )?know (?:\w+ )?(?:was|were|had been) holding\b",
    # the weight of his words / the weight of the world
    r"\bthe weight of (?:\w+ )?(?:words|world|it all)\b",
    # sent a shiver through / sending a jolt of electricity down
    r"\bsen(?:t|ding) (?:a )?(?:jolt|shiver|chill|wave) (?:of \w+ )?(?:through|down|up)\b",
    # a rich tapestry of
    r"\b(?:rich |intricate |vibrant )?tapestry of\b",
    # maybe, just maybe
    r"\bmaybe,? just maybe\b",
    # little did she know
    r"\blittle did (?:he|she|they|i|we) know\b",
    # a smile playing on her lips / a smirk tugging at the corners of his mouth
    r"\b(?:smile|smirk|grin) (?:playing|tugging) (?:at|on) (?:the corners? of )?(?:his|her|their) (?:lips|mouth)\b",
    # it's not about X, it's about Y
    r"\bit[’']?s not (?:just )?about (?:\w+ ){0,4}\w+[,;] it[’']?s about\b",
)
