"""What the embedded sites sell: the word lists of the shop and the booking site, items and
instructions.

A *domain* fixes the words (categories, title attributes, page-only features, options) and
the sentence templates of one site; ``sample_catalog`` draws a task's catalog around one
target item so that the target is the only item matching every constraint of the instruction,
while distractors each miss one (same category other colour, same attributes over budget, the
option not offered, ...). That is what makes WebShop's attribute / option / price reward
informative: a wrong choice scores partially, and only the exact match scores 1.
"""

from __future__ import annotations

import dataclasses

import numpy as np

MAX_PRICE = 200  # every price and budget is an integer in [1, MAX_PRICE] (closed vocabulary)


@dataclasses.dataclass(frozen=True)
class Domain:
    """The words and templates of one site."""

    name: str
    categories: tuple[str, ...]  # the item's type (WebShop's r_type): jacket / rome
    title_attrs: tuple[str, ...]  # attribute shown in the title and the listing: blue
    features: tuple[str, ...]  # attributes shown only on the item page: waterproof
    brands: tuple[str, ...]  # title words that carry no constraint
    option_name: str  # the select on the item page: size / room
    options: tuple[str, ...]  # its values: s m l xl / single double suite
    buy_task: str  # the instruction of a purchase task
    save_task: str  # the instruction of a save (no purchase) task
    unit: str  # price words after the number: "dollars" / "dollars a night"
    price_range: tuple[int, int]
    named_slot: str  # the words of the templates that a quoted title replaces (name_item)


SHOP = Domain(
    name="shop",
    categories=("jacket", "shoes", "shirt", "bag", "hat", "dress"),
    title_attrs=("blue", "red", "black", "green", "white", "grey"),
    features=("waterproof", "cotton", "wool", "leather", "hooded", "slim"),
    brands=("nordic", "urban", "alpine", "coast", "metro", "sierra"),
    option_name="size",
    options=("s", "m", "l", "xl"),
    buy_task="buy a {attr} {category} that is {feature} in size {option} under {budget} dollars",
    save_task=(
        "save a {attr} {category} that is {feature} in size {option} under {budget} dollars , "
        "do not pay"
    ),
    unit="dollars",
    price_range=(10, 150),
    named_slot="a {attr} {category}",
)

BOOKING = Domain(
    name="booking",
    categories=("rome", "paris", "oslo", "lisbon", "vienna", "prague"),
    title_attrs=("hotel", "hostel", "inn", "lodge", "suites", "apartments"),
    features=("breakfast", "pool", "parking", "wifi", "gym", "spa"),
    brands=("grand", "river", "royal", "garden", "central", "harbor"),
    option_name="room",
    options=("single", "double", "family", "suite"),
    buy_task=(
        "book a {option} room at a {attr} in {category} with {feature} under {budget} "
        "dollars a night"
    ),
    save_task=(
        "hold a {option} room at a {attr} in {category} with {feature} under {budget} "
        "dollars a night , do not pay"
    ),
    unit="dollars a night",
    price_range=(30, 190),
    named_slot="a {attr} in {category}",
)

DOMAINS = {"shop": SHOP, "booking": BOOKING}


def item_title(domain: Domain, item: dict) -> str:
    """The words an item is listed under: ``blue nordic jacket`` / ``grand hotel rome``."""
    if domain.name == "booking":
        return f"{item['brand']} {item['attr']} {item['category']}"
    return f"{item['attr']} {item['brand']} {item['category']}"


def _pick(rng: np.random.Generator, values, avoid=()) -> str:
    return str(rng.choice([v for v in values if v not in avoid]))


def _distractor(domain: Domain, target: dict, kind: str, budget: int, rng) -> dict:
    """An item that misses exactly the constraint ``kind`` of the instruction."""
    item = dict(target, features=list(target["features"]), options=list(target["options"]))
    lo = domain.price_range[0]
    item["price"] = int(rng.integers(lo, budget + 1))
    if kind == "category":
        item["category"] = _pick(rng, domain.categories, [target["category"]])
    elif kind == "attr":
        item["attr"] = _pick(rng, domain.title_attrs, [target["attr"]])
    elif kind == "feature":
        others = [f for f in domain.features if f != target["want_feature"]]
        item["features"] = [str(f) for f in rng.choice(others, size=2, replace=False)]
    elif kind == "option":
        item["options"] = [o for o in domain.options if o != target["want_option"]]
    elif kind == "price":
        item["price"] = int(rng.integers(budget + 1, min(budget + 60, MAX_PRICE) + 1))
    item["brand"] = _pick(rng, domain.brands)
    return item


def sample_catalog(domain: Domain, rng: np.random.Generator, num_items: int) -> dict:
    """One task's catalog: the target, its instruction and ``num_items - 1`` distractors.

    Returns a dict with ``items`` (shuffled; each has title, category, attr, features,
    options, price), ``target`` (its index), ``want`` (category, attr, feature, option,
    budget) and ``kind`` ("buy" or "save").
    """
    lo, hi = domain.price_range
    budget = int(rng.integers(lo + 15, hi + 1))
    feature = _pick(rng, domain.features)
    option = _pick(rng, domain.options)
    target = {
        "category": _pick(rng, domain.categories),
        "attr": _pick(rng, domain.title_attrs),
        "brand": _pick(rng, domain.brands),
        "features": sorted([feature, _pick(rng, domain.features, [feature])]),
        "options": sorted(
            {option, *map(str, rng.choice(domain.options, size=2))}, key=domain.options.index
        ),
        "price": int(rng.integers(lo, budget + 1)),
        "want_feature": feature,
        "want_option": option,
    }
    kinds = ["category", "attr", "feature", "option", "price"]
    items = [target] + [
        _distractor(domain, target, kinds[i % len(kinds)], budget, rng)
        for i in range(num_items - 1)
    ]
    titles = {item_title(domain, target)}
    for item in items[1:]:  # unique titles: the listing is the only way to tell items apart
        while item_title(domain, item) in titles:
            free = [
                b for b in domain.brands if item_title(domain, dict(item, brand=b)) not in titles
            ]
            if free:
                item["brand"] = _pick(rng, free)
            else:  # every brand taken: another title attribute (still not the target's)
                item["attr"] = _pick(rng, domain.title_attrs, [target["attr"]])
        titles.add(item_title(domain, item))
    order = rng.permutation(len(items))
    shuffled = []
    for i in order:
        item = {k: v for k, v in items[i].items() if not k.startswith("want_")}
        item["title"] = item_title(domain, item)
        shuffled.append(item)
    want = {
        "category": target["category"],
        "attr": target["attr"],
        "feature": feature,
        "option": option,
        "budget": budget,
    }
    kind = "save" if rng.random() < 0.25 else "buy"
    return {
        "items": shuffled,
        "target": int(np.argmax(order == 0)),
        "want": want,
        "kind": kind,
    }


def instruction(domain: Domain, catalog: dict, name_item: bool = False) -> str:
    """The task's sentence. ``name_item`` names the target by its quoted title instead of its
    title attribute (``buy " red sierra bag " that is hooded ...``): the listing then tells
    the target apart without opening item pages, so every step of the expert (who knows the
    title) is readable from what the policy sees, and the quotes let an induction head copy
    the title into ``search ( " red sierra bag " )``. Without it the instruction names
    attributes only, as WebShop's do, and telling same-listing items apart takes opening
    their pages."""
    template = domain.save_task if catalog["kind"] == "save" else domain.buy_task
    if name_item:
        title = catalog["items"][catalog["target"]]["title"]
        template = template.replace(domain.named_slot, f'" {title} "')
    return template.format(**catalog["want"])


def template_words(domain: Domain) -> set[str]:
    words: set[str] = set()
    for template in (domain.buy_task, domain.save_task, domain.unit):
        for w in template.split():
            if not (w.startswith("{") and w.endswith("}")):
                words.add(w)
    return words
