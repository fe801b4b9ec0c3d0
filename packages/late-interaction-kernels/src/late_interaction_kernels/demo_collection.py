"""The demo's text collection: short English passages on varied topics, queries that each
paraphrase one passage (reworded, so that matching needs more than shared words), and the articles
the demo searches: each mixes several unrelated passages, the setting where matching a query's
tokens against a document's tokens (MaxSim) beats comparing one averaged vector per text."""

from __future__ import annotations

PASSAGES: tuple[str, ...] = (
    "Honeybees communicate the direction and distance of flowers to their hive mates with a waggle dance.",
    "The Great Barrier Reef, off the coast of Queensland, is the largest coral reef system on Earth.",
    "Sourdough bread rises because wild yeast and lactic acid bacteria ferment the flour in the starter.",
    "A binary search halves the sorted range at every step, so it finds an item in logarithmic time.",
    "The Rosetta Stone carried the same decree in Greek and Egyptian scripts, which let scholars read hieroglyphs.",
    "Photosynthesis in plant leaves turns sunlight, water and carbon dioxide into sugar and oxygen.",
    "Marathon runners hit the wall when their muscles run out of stored glycogen late in the race.",
    "Volcanic eruptions can cool the planet for a year or two by filling the stratosphere with sulfate aerosols.",
    "The printing press of Johannes Gutenberg made books cheap enough to spread literacy across Europe.",
    "Espresso is brewed by forcing hot water through finely ground coffee at about nine bars of pressure.",
    "Octopuses can change the colour and texture of their skin in a fraction of a second to hide from predators.",
    "Compound interest means that the interest earned each year is itself added to the principal and earns interest.",
    "The Amazon river carries more water to the sea than the next seven largest rivers combined.",
    "Vaccines train the immune system by exposing it to a harmless piece or copy of a pathogen.",
    "In chess, castling moves the king two squares toward a rook and puts the rook on the other side of the king.",
    "Jupiter is a gas giant more than twice as massive as all the other planets of the solar system together.",
    "A violin's sound comes from the bow's horsehair gripping and releasing the strings many times a second.",
    "Lithium-ion batteries lose capacity over time as side reactions consume lithium and thicken the electrode films.",
    "Tectonic plates drift a few centimetres a year, about as fast as fingernails grow.",
    "Penguins huddle together in the Antarctic winter and take turns standing on the cold outer edge of the group.",
    "The Roman aqueducts brought water into cities using only a gentle, steady downhill slope over many kilometres.",
    "Regular sleep helps the brain consolidate memories formed during the day.",
    "A transformer language model predicts the next token by attending to all earlier tokens in its context.",
    "Glaciers carve U-shaped valleys as the moving ice grinds the rock beneath it.",
    "The Silk Road was a network of trade routes that linked China with the Mediterranean for centuries.",
    "Tomatoes were once feared in Europe as poisonous because they belong to the nightshade family.",
    "Public-key cryptography lets anyone encrypt a message that only the holder of the private key can read.",
    "Monarch butterflies migrate thousands of kilometres from Canada to overwintering forests in Mexico.",
    "The speed of light in a vacuum is about three hundred thousand kilometres per second.",
    "Wind turbines turn the kinetic energy of moving air into electricity through a generator in the nacelle.",
    "Mount Everest grows a few millimetres each year as the Indian plate pushes under Asia.",
    "Olive oil is made by crushing olives into a paste and separating the oil from the water and solids.",
    "A suspension bridge hangs its deck from vertical cables attached to main cables draped over tall towers.",
    "Elephants recognise themselves in a mirror, a sign of self-awareness shared with great apes and dolphins.",
    "Inflation erodes the purchasing power of money, so the same salary buys fewer goods each year.",
    "The Apollo 11 mission landed the first humans on the Moon in July 1969.",
    "Bamboo is a grass, and some species can grow almost a metre in a single day.",
    "Recycling aluminium cans uses about five percent of the energy needed to make new aluminium from ore.",
    "Jazz musicians often improvise melodies over a repeating chord progression.",
    "The human heart beats around one hundred thousand times a day, pumping blood through the body.",
    "Deserts can be cold: the Gobi has freezing winters, and Antarctica is the largest desert of all.",
    "A haiku is a short Japanese poem of three lines with five, seven and five syllables.",
    "Antibiotics kill bacteria but have no effect on viruses such as those that cause the common cold.",
    "Hot air balloons float because heated air inside the envelope is less dense than the cooler air outside.",
    "The Dead Sea is so salty that swimmers float on its surface without effort.",
    "Git records a project's history as a chain of commits, each pointing to the snapshot before it.",
    "Sharks have existed for more than four hundred million years, longer than trees.",
    "Composting turns kitchen scraps and garden waste into fertile soil with the help of microbes and worms.",
    "The Eiffel Tower was built for the 1889 World's Fair and was at first criticised by Parisian artists.",
    "Caffeine keeps people awake by blocking adenosine receptors that signal tiredness in the brain.",
    "Rainbows appear when sunlight is refracted, reflected and dispersed inside raindrops.",
    "A sonnet has fourteen lines, and Shakespeare's follow a rhyme scheme ending in a couplet.",
    "Owls can turn their heads about two hundred and seventy degrees thanks to extra neck vertebrae.",
    "The stock market lets companies raise money by selling shares of ownership to investors.",
    "Solar panels generate electricity when photons knock electrons loose in layers of silicon.",
    "Tea originated in China, where it was first drunk as a medicinal infusion.",
)

#: ``(query, index of the passage it paraphrases)``.
QUERIES: tuple[tuple[str, int], ...] = (
    ("how do bees tell other bees where the food is", 0),
    ("why does a loaf made with a natural starter rise", 2),
    ("what let researchers finally decipher ancient Egyptian writing", 4),
    ("why do long-distance runners suddenly run out of energy near the end", 6),
    ("how can an eruption make the world colder", 7),
    ("why does money left in a savings account grow faster over time", 11),
    ("which river discharges the most water into the ocean", 12),
    ("why do phone batteries hold less charge as they get older", 17),
    ("how did ancient Rome supply its towns with water", 20),
    ("how can a message be sent securely without sharing a secret password first", 26),
    ("which animals pass the mirror test besides apes", 33),
    ("why can't penicillin cure a cold", 42),
    ("what makes a hot-air balloon rise", 43),
    ("how do coffee drinks keep you from feeling sleepy", 49),
    ("what causes the colours in the sky after rain", 50),
    ("where is the biggest coral reef in the world", 1),
    ("how quickly can you find a name in a sorted list by repeatedly splitting it", 3),
    ("how do leaves make food from light", 5),
    ("what invention made books affordable for ordinary Europeans", 8),
    ("how is a strong small coffee made with high pressure", 9),
    ("how do octopuses camouflage themselves", 10),
    ("which chess move lets the king and a rook switch sides", 14),
    ("which planet is heavier than all the others put together", 15),
    ("how do penguins survive the freezing polar winter", 19),
    ("how does a language model guess the following word", 22),
    ("how fast does light travel in empty space", 28),
    ("how is the road of a suspension bridge held up", 32),
    ("when did astronauts first walk on the Moon", 35),
    ("how does version control store the history of a codebase", 45),
    ("how far can an owl rotate its head", 52),
)

#: Passages per article: the demo's documents are articles that each mix this many unrelated
#: passages, so a query matches a few of an article's tokens, not its average.
ARTICLE_PASSAGES = 6
_N_ARTICLES = -(-len(PASSAGES) // ARTICLE_PASSAGES)
#: Article ``j`` holds passages ``j, j + n, j + 2n, ...`` (``n`` articles): neighbours in
#: ``PASSAGES`` land in different articles.
ARTICLES: tuple[str, ...] = tuple(" ".join(PASSAGES[j::_N_ARTICLES]) for j in range(_N_ARTICLES))
#: The article that holds each passage.
ARTICLE_OF: tuple[int, ...] = tuple(i % _N_ARTICLES for i in range(len(PASSAGES)))
