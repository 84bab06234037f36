"""Words for the keys of generated needles: an adjective and a noun joined by a hyphen ("sour-lantern"), as RULER's
keys are (it draws them from the wonderwords package's lists; these short lists are kvviz's own)."""

ADJECTIVES = (
    "amber", "ancient", "bitter", "bold", "brave", "brisk", "calm", "clever", "cold", "crisp", "curious", "dusty",
    "eager", "early", "faint", "fancy", "fierce", "fresh", "gentle", "glossy", "golden", "grumpy", "hollow", "humble",
    "icy", "jolly", "keen", "lazy", "little", "lively", "loud", "lucky", "mellow", "misty", "modest", "narrow",
    "noisy", "odd", "pale", "polite", "proud", "quick", "quiet", "rapid", "rough", "rusty", "salty", "shiny",
    "silent", "silver", "sleepy", "slim", "sour", "spicy", "steady", "stormy", "sunny", "tame", "tender", "tidy",
    "tiny", "vivid", "warm", "weary", "wild", "windy", "wise", "wooden", "young", "zealous",
)

NOUNS = (
    "anchor", "apple", "arrow", "badge", "basket", "beacon", "bell", "blanket", "bottle", "bridge", "bucket",
    "cabin", "candle", "canyon", "carpet", "castle", "cellar", "chair", "cloud", "comet", "compass", "cottage",
    "crayon", "desert", "drum", "eagle", "engine", "feather", "fence", "forest", "fountain", "garden", "glacier",
    "harbor", "helmet", "island", "jacket", "kettle", "ladder", "lantern", "letter", "meadow", "mirror", "mountain",
    "needle", "orchard", "otter", "pebble", "pencil", "piano", "pillow", "planet", "pocket", "puzzle", "rabbit",
    "ribbon", "river", "saddle", "shovel", "spoon", "statue", "teapot", "ticket", "tower", "tunnel", "valley",
    "violin", "wagon", "whistle", "window",
)
