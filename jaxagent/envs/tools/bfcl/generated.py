"""Generated long-horizon tasks over BFCL's own app backends (``env.name: bfcl_gen``).

BFCL ships 200 entries a multi-turn category: too few for a model built from scratch to learn
requests it has not seen. This module draws thousands of tasks in the same entry format and
plays them on the same backends (``bfcl-eval``'s ``GorillaFileSystem``, ``MessageAPI``,
``TradingBot``, ``TicketAPI``, ``MathAPI``; ``TwitterAPI``, ``VehicleControlAPI`` and
``TravelAPI`` as distractor apps), so ``BFCLEnv`` runs and judges them as BFCL judges its own:
at the end of every user turn the apps' state must equal the state reached by the ground truth
(``state_checker``) and the ground truth's call results must be among the agent's
(``response_checker``); a turn that asks a question also needs the answer in the reply that
ends it (``Final: <answer>``).

A task is a *composition*: 2-3 request templates (one user turn each), drawn in order, played
on a random initial state of the apps (a seeded draw of stocks and prices, users and ids,
tickets, folders, files and their lines). Each template needs information from an earlier
result of the same turn: a stock's symbol and price, a user's id, a ticket's id, where a file
lives and what it says. The ground truth is recorded by playing the templates on live app
instances, grouped into *steps* (the calls that can be sent before the next result must be
read): the expert sends a step, reads nothing (the values are its own), and the learner must
read the result to write the next one. A task needs 5-15 calls in all. The prompt lists the
tools the task uses plus distractors from every involved app, shuffled.

Held-out tasks are *unseen compositions on unseen states*: the seeded hash of a composition's
key (its ordered template names) puts it in train or test, so no test composition is ever
trained on; every template appears in both (what is tested is composing them on new states).
``check_disjoint`` refuses a source where a composition, an initial state or a whole request
sequence is in both splits. The ``ood`` split holds real BFCL entries (``ood_category``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import re
from typing import Any, Callable

import numpy as np

from jaxagent.envs.base import SplitLeakageError, Task, check_disjoint_splits
from jaxagent.envs.tool_spec import ToolCall
from jaxagent.envs.tools.bfcl import data as D

CATEGORY = "bfcl_gen"
DISTRACTOR_CLASSES = ("TwitterAPI", "VehicleControlAPI", "TravelAPI")
# get_symbol_by_name's fixed table (TradingBot) for the companies whose stock a state may hold
COMPANIES = {
    "Apple": "AAPL",
    "Google": "GOOG",
    "Tesla": "TSLA",
    "Microsoft": "MSFT",
    "Nvidia": "NVDA",
    "Zeta Corp": "ZETA",
    "Alpha Tech": "ALPH",
    "Omega Industries": "OMEG",
    "Quasar Ltd.": "QUAS",
    "Neptune Systems": "NEPT",
    "Synex Solutions": "SYNX",
}
PEOPLE = ("Alice", "Bob", "Carla", "Dev", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jon")
TICKET_TITLES = (
    "printer jam",
    "vpn down",
    "login loop",
    "slow wifi",
    "disk full",
    "mail bounce",
    "screen flicker",
    "badge reset",
)
NOTES = ("fixed", "replaced cable", "restarted", "cleared cache", "updated driver")
MESSAGES = ("see you at 3", "call me back", "lunch at noon", "report is ready", "on my way")
FOLDERS = ("docs", "logs", "notes", "drafts", "archive", "media")
FILES = (
    "plan.txt",
    "todo.md",
    "budget.csv",
    "report.txt",
    "ideas.md",
    "log.txt",
    "memo.txt",
    "list.csv",
)
WORDS = (
    "alpha",
    "delta",
    "sigma",
    "omega",
    "gamma",
    "kappa",
    "lambda",
    "theta",
    "zeta",
    "beta",
)


# ------------------------------------------------------------------ random initial states
def random_state(rng: np.random.Generator, classes) -> dict[str, dict]:
    """A seeded initial configuration for each stateful class in ``classes``."""
    out: dict[str, dict] = {}
    if "TradingBot" in classes:
        names = rng.choice(sorted(COMPANIES), size=5, replace=False)
        stocks = {
            COMPANIES[n]: {
                "price": round(float(rng.uniform(10, 400)), 2),
                "percent_change": round(float(rng.uniform(-1, 1)), 2),
                "volume": round(float(rng.uniform(0.5, 3)), 3),
            }
            for n in names
        }
        out["TradingBot"] = {
            "stocks": stocks,
            "account_info": {
                "account_id": int(rng.integers(10000, 99999)),
                "balance": round(float(rng.uniform(8000, 20000)), 2),
                "binding_card": int(rng.integers(10**15, 10**16)),
            },
            "authenticated": True,
            "market_status": "Open",
            "order_counter": int(rng.integers(10000, 99999)),
            "orders": {},
            "watch_list": [COMPANIES[str(names[0])]],
            "transaction_history": [],
            "random_seed": int(rng.integers(1, 10**6)),
        }
    if "MessageAPI" in classes:
        people = [str(p) for p in rng.choice(PEOPLE, size=4, replace=False)]
        ids = rng.choice(np.arange(100, 1000), size=4, replace=False)
        user_map = {p: f"USR{int(i)}" for p, i in zip(people, ids)}
        out["MessageAPI"] = {
            "user_map": user_map,
            "user_count": 4,
            "inbox": [],
            "message_count": 0,
            "current_user": user_map[people[0]],
            "generated_ids": set(),
            "random_seed": int(rng.integers(1, 10**6)),
        }
    if "TicketAPI" in classes:
        user = str(rng.choice(PEOPLE)).lower()
        titles = rng.choice(TICKET_TITLES, size=2, replace=False)
        ids = sorted(int(i) for i in rng.choice(np.arange(100, 1000), size=2, replace=False))
        queue = [
            {
                "id": i,
                "title": str(t),
                "description": "",
                "status": "Open",
                "priority": int(rng.integers(1, 6)),
                "created_by": user,
            }
            for i, t in zip(ids, titles)
        ]
        out["TicketAPI"] = {
            "ticket_queue": queue,
            "ticket_counter": ids[-1] + int(rng.integers(1, 50)),
            "current_user": user,
        }
    if "GorillaFileSystem" in classes:
        folders = rng.choice(FOLDERS, size=2, replace=False)
        files = list(rng.choice(FILES, size=4, replace=False))
        root: dict[str, Any] = {}
        for k, folder in enumerate(folders):
            contents = {}
            for name in files[2 * k : 2 * k + 2]:
                lines = [
                    " ".join(rng.choice(WORDS, size=3, replace=False))
                    for _ in range(int(rng.integers(2, 5)))
                ]
                contents[str(name)] = {"type": "file", "content": "\n".join(lines)}
            root[str(folder)] = {"type": "directory", "contents": contents}
        out["GorillaFileSystem"] = {"root": {"workspace": {"type": "directory", "contents": root}}}
    return out


# ------------------------------------------------------------------ playing templates
class Recorder:
    """Live app instances on which templates are played; records the calls as steps."""

    def __init__(self, instances: dict[str, Any], config: dict[str, dict]):
        self.instances, self.config = instances, config
        self.methods = D.public_methods(instances)
        self.turns: list[dict] = []
        self.results: list[str] = []  # every call's result, as the env shows it
        self.longest_result = 0  # characters of the longest result (the env cuts results)

    def turn(self, text: str) -> None:
        self.turns.append({"text": text, "steps": [[]], "answer": None, "key": None})

    def step(self) -> None:
        self.turns[-1]["steps"].append([])

    def call(self, _tool: str, **kwargs) -> Any:
        result = self.methods[_tool](**kwargs)
        if isinstance(result, dict) and "error" in result:  # a template bug, never data
            raise RuntimeError(f"generated call {_tool}({kwargs}) failed: {result}")
        self.turns[-1]["steps"][-1].append(ToolCall(_tool, kwargs).render())
        self.results.append(D.keyword_text(result))
        self.longest_result = max(self.longest_result, len(D.format_result(result)))
        return result

    def answer(self, result: dict, key: str) -> None:
        """The turn's question is answered by ``result[key]`` (the expert writes key=value)."""
        self.turns[-1]["answer"], self.turns[-1]["key"] = str(result[key]), key

    # views of the live state the templates choose from
    def trading(self):
        return self.instances["TradingBot"]

    def companies(self) -> list[str]:
        stocks = self.trading().stocks
        return [n for n, s in COMPANIES.items() if s in stocks]

    def people(self) -> list[str]:
        api = self.instances["MessageAPI"]
        return [p for p, i in api.user_map.items() if i != api.current_user]

    def files(self) -> list[tuple[str, str, str]]:
        """``(folder, file, content)`` of every file under the workspace."""
        root = self.instances["GorillaFileSystem"].root
        return [
            (folder, name, f.content)
            for folder, d in root.contents.items()
            for name, f in d.contents.items()
            if hasattr(f, "content")
        ]


def _pick(rng, items):
    return items[int(rng.integers(len(items)))]


def _lookup_price(w: Recorder, company: str) -> tuple[str, float]:
    symbol = w.call("get_symbol_by_name", name=company)["symbol"]
    w.step()
    return symbol, w.call("get_stock_info", symbol=symbol)["price"]


def t_trade_buy(w: Recorder, rng) -> None:
    company = _pick(rng, w.companies())
    price = w.trading().stocks[COMPANIES[company]]["price"]
    n = int(rng.integers(2, max(3, min(30, int(w.trading().account_info["balance"] // price)))))
    w.turn(f"Buy {n} shares of {company} at the current price.")
    symbol, price = _lookup_price(w, company)
    w.step()
    w.call("place_order", order_type="Buy", symbol=symbol, price=price, amount=n)


def t_trade_cost(w: Recorder, rng) -> None:
    company, n = _pick(rng, w.companies()), int(rng.integers(2, 30))
    w.turn(f"What would {n} shares of {company} cost at the current price?")
    _, price = _lookup_price(w, company)
    w.step()
    w.answer(w.call("multiply", a=price, b=n), "result")


def t_trade_watch(w: Recorder, rng) -> None:
    company = _pick(rng, w.companies())
    w.turn(f"Add {company} to my watchlist.")
    symbol = w.call("get_symbol_by_name", name=company)["symbol"]
    w.step()
    w.call("add_to_watchlist", stock=symbol)


def t_msg_send(w: Recorder, rng) -> None:
    person, text = _pick(rng, w.people()), _pick(rng, MESSAGES)
    w.turn(f"Send '{text}' to {person}.")
    user_id = w.call("get_user_id", user=person)["user_id"]
    w.step()
    w.call("send_message", receiver_id=user_id, message=text)


def t_ticket_resolve(w: Recorder, rng) -> None:
    queue = w.instances["TicketAPI"].ticket_queue
    titles = [t["title"] for t in queue if t["status"] == "Open"]
    title = _pick(rng, [t for t in titles if titles.count(t) == 1])
    note = _pick(rng, NOTES)
    w.turn(f"Resolve my ticket '{title}' with the note '{note}'.")
    tickets = w.call("get_user_tickets")
    w.step()
    ticket = next(t for t in tickets if t["title"] == title)
    w.call("resolve_ticket", ticket_id=ticket["id"], resolution=note)


def t_ticket_open(w: Recorder, rng) -> None:
    title, priority = _pick(rng, TICKET_TITLES), int(rng.integers(1, 6))
    w.turn(f"Open a ticket '{title}' with priority {priority} and tell me its id.")
    w.answer(w.call("create_ticket", title=title, priority=priority), "id")


def t_fs_count(w: Recorder, rng) -> None:
    folder, name, _ = _pick(rng, w.files())
    w.turn(f"How many lines does {name} have?")
    w.call("find", name=name)
    w.step()
    w.call("cd", folder=folder)
    w.answer(w.call("wc", file_name=name, mode="l"), "count")


def t_fs_copy_line(w: Recorder, rng) -> None:
    def once(content):  # words on exactly one line of the file: grep finds one line
        return [x for x in WORDS if sum(x in ln.split() for ln in content.splitlines()) == 1]

    folder, name, content = _pick(rng, [f for f in w.files() if once(f[2])])
    word = _pick(rng, once(content))
    new = f"{word}.txt"
    w.turn(f"Copy the line of {name} that mentions {word} into a new file {new} next to it.")
    w.call("find", name=name)
    w.step()
    w.call("cd", folder=folder)
    line = w.call("grep", file_name=name, pattern=word)["matching_lines"][0]
    w.step()
    w.call("touch", file_name=new)
    w.call("echo", content=line, file_name=new)


def t_fs_send(w: Recorder, rng) -> None:
    folder, name, _ = _pick(rng, w.files())
    person = _pick(rng, w.people())
    w.turn(f"Send the content of {name} to {person}.")
    w.call("find", name=name)
    user_id = w.call("get_user_id", user=person)["user_id"]
    w.step()
    w.call("cd", folder=folder)
    content = w.call("cat", file_name=name)["file_content"]
    w.step()
    w.call("send_message", receiver_id=user_id, message=content)


def t_price_send(w: Recorder, rng) -> None:
    company, person = _pick(rng, w.companies()), _pick(rng, w.people())
    w.turn(f"Message {person} the current price of {company} as price=<the price>.")
    user_id = w.call("get_user_id", user=person)["user_id"]
    _, price = _lookup_price(w, company)
    w.step()
    w.call("send_message", receiver_id=user_id, message=f"price={price}")


def t_ticket_price(w: Recorder, rng) -> None:
    company = _pick(rng, w.companies())
    w.turn(f"Open a ticket '{company} price' whose description is price=<its current price>.")
    _, price = _lookup_price(w, company)
    w.step()
    # "price=202.84", not "202.84": the value is written after the tokens it was read after
    w.call("create_ticket", title=f"{company} price", description=f"price={price}")


@dataclasses.dataclass(frozen=True)
class Template:
    name: str
    classes: tuple[str, ...]
    calls: int  # calls of its ground truth (fixed per template)
    play: Callable[[Recorder, Any], None]


TEMPLATES = {
    t.name: t
    for t in (
        Template("trade_buy", ("TradingBot",), 3, t_trade_buy),
        Template("trade_cost", ("TradingBot", "MathAPI"), 3, t_trade_cost),
        Template("trade_watch", ("TradingBot",), 2, t_trade_watch),
        Template("msg_send", ("MessageAPI",), 2, t_msg_send),
        Template("ticket_resolve", ("TicketAPI",), 2, t_ticket_resolve),
        Template("ticket_open", ("TicketAPI",), 1, t_ticket_open),
        Template("fs_count", ("GorillaFileSystem",), 3, t_fs_count),
        Template("fs_copy_line", ("GorillaFileSystem",), 5, t_fs_copy_line),
        Template("fs_send", ("GorillaFileSystem", "MessageAPI"), 5, t_fs_send),
        Template("price_send", ("TradingBot", "MessageAPI"), 4, t_price_send),
        Template("ticket_price", ("TradingBot", "TicketAPI"), 3, t_ticket_price),
    )
}


def compositions(min_calls: int, max_calls: int, max_templates: int) -> list[tuple[str, ...]]:
    """Every ordered tuple of 2..``max_templates`` distinct templates with ``min_calls`` to
    ``max_calls`` calls in all and at most one file-system template (they would share the
    working directory) and tickets listed before any is opened."""
    out = []
    for k in range(2, max_templates + 1):
        for combo in itertools.permutations(sorted(TEMPLATES), k):
            calls = sum(TEMPLATES[t].calls for t in combo)
            fs = sum("GorillaFileSystem" in TEMPLATES[t].classes for t in combo)
            if min_calls <= calls <= max_calls and fs <= 1 and _tickets_listed_first(combo):
                out.append(combo)
    return out


def _tickets_listed_first(combo) -> bool:
    # The ticket list is read before any ticket is opened: two tickets fit a cut result
    # (about 240 characters), four would not.
    if "ticket_resolve" not in combo:
        return True
    opens = [i for i, t in enumerate(combo) if t in ("ticket_open", "ticket_price")]
    return all(combo.index("ticket_resolve") < i for i in opens)


def composition_key(combo) -> str:
    return "+".join(combo)


def make_entry(combo, state_seed: int, entry_id: str, distractor_tools: int) -> dict:
    """Plays ``combo`` on the seeded state ``state_seed``: a BFCL-format entry with the
    per-turn ground truth, its steps, answers and the tools shown."""
    rng = np.random.default_rng([state_seed, 1])
    needed = sorted({c for t in combo for c in TEMPLATES[t].classes})
    distractor = str(_pick(rng, DISTRACTOR_CLASSES))
    classes = needed + [distractor]
    config = random_state(rng, classes)
    entry = {
        "id": entry_id,
        "category": CATEGORY,
        "involved_classes": classes,
        "initial_config": config,
    }
    w = Recorder(D.make_instances(entry), config)  # instances get copies: config stays
    for name in combo:
        TEMPLATES[name].play(w, rng)
    calls = [[c for s in t["steps"] for c in s] for t in w.turns]
    used = {c.split("(")[0] for turn in calls for c in turn}
    others = sorted(n for n in D.tool_specs(entry, w.methods) if n not in used)
    shown = sorted(used) + [
        str(n) for n in rng.choice(others, size=min(distractor_tools, len(others)), replace=False)
    ]
    rng.shuffle(shown)
    return {
        **entry,
        "question": [[{"role": "user", "content": t["text"]}] for t in w.turns],
        "ground_truth": calls,
        "steps": [t["steps"] for t in w.turns],
        "answers": [[t["answer"]] if t["answer"] is not None else [] for t in w.turns],
        "answer_keys": [[t["key"]] if t["key"] is not None else [] for t in w.turns],
        "shown_functions": [str(n) for n in shown],
        "composition": list(combo),
        "state_seed": state_seed,
        "longest_result": w.longest_result,
        "results": w.results,
    }


@functools.lru_cache(maxsize=None)
def _class_signatures(class_name: str) -> dict[str, str]:
    entry = {"involved_classes": [class_name], "initial_config": {}, "category": CATEGORY}
    specs = D.tool_specs(entry, D.public_methods(D.make_instances(entry)))
    return {n: s.signature() for n, s in specs.items()}


def _signature(classes: tuple[str, ...], name: str) -> str:
    # the last class documenting the name wins, as in ``data.public_methods``
    return next(
        _class_signatures(c)[name] for c in reversed(classes) if name in _class_signatures(c)
    )


def task_prompt(entry: dict) -> str:
    """The task as text: the tools it lists (compact signatures), every user request and the
    ground truth's calls and results. A tokenizer learned on the train split's prompts
    (``tokenizer.kind: bpe``) then has merges for the tool names, argument syntax and result
    keys the episodes are made of (an expert episode is ~25% fewer tokens than with merges
    of the signatures and requests only)."""
    classes = tuple(entry["involved_classes"])
    tools = [_signature(classes, n) for n in entry["shown_functions"]]
    requests = [m["content"] for turn in entry["question"] for m in turn]
    calls = [c for turn in entry["ground_truth"] for c in turn]
    results = entry.get("results", [""] * len(calls))
    lines = tools + [f"User: {r}" for r in requests]
    lines += [f"{c} -> {r}" for c, r in zip(calls, results)]
    return _NUMBER.sub("", "\n".join(lines))


# Numbers are left out of the prompt (the BPE's corpus): a byte-level BPE learned on "priority
# 5" merges a space with the digit after it (GPT-2's pre-tokenizer keeps " 5" one piece), so a
# value read after a space ('"id": 838', "priority 5", "Final: 984") starts with another token
# than the same value written after "=" in a call (ticket_id=838), and a model built from
# scratch must learn to translate every first digit: the first run's SFT policy copied 838 as
# 688 and solved nothing. Without digits in the corpus no merge touches one: every digit is
# its own token in every context (" 838" is the space, then 8, 3, 8), so copying is copying.
_NUMBER = re.compile(r"\d")


def state_digest(entry: dict) -> str:
    return hashlib.sha1(
        json.dumps(entry["initial_config"], sort_keys=True, default=sorted).encode()
    ).hexdigest()


# ------------------------------------------------------------------ the task source
@dataclasses.dataclass(frozen=True, kw_only=True)
class BFCLGenConfig:
    num_train: int = 4000  # training tasks (train compositions x training states)
    num_test: int = 200  # held-out tasks (test compositions x held-out states)
    test_fraction: float = 0.25  # share of compositions held out (seeded hash of the key)
    seed: int = 0  # changes which compositions are held out and every state
    min_calls: int = 5  # calls a task needs in all, at least
    max_calls: int = 15  # ... and at most
    max_templates: int = 3  # user turns a task has, at most (each one template)
    distractor_tools: int = 4  # tools shown beside the ones the task uses
    ood_category: str = "multi_turn_base"  # real BFCL entries of the "ood" split
    ood_limit: int | None = None  # the first entries of it only

    def __post_init__(self):
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(
                f"BFCLGenConfig.test_fraction must be in (0, 1), got {self.test_fraction}"
            )
        for name in ("num_train", "num_test", "min_calls", "max_calls"):
            if getattr(self, name) < 1:
                raise ValueError(f"BFCLGenConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_templates < 2:
            raise ValueError(f"BFCLGenConfig.max_templates must be >= 2, got {self.max_templates}")
        if not compositions(self.min_calls, self.max_calls, self.max_templates):
            raise ValueError(
                f"no composition of templates needs {self.min_calls}..{self.max_calls} calls "
                f"with at most {self.max_templates} templates; widen min_calls/max_calls"
            )


class BFCLGenSource:
    """Generated tasks: "train" and "test" (unseen compositions on unseen states) and "ood"
    (real BFCL entries). Tasks are generated on first use of their split."""

    def __init__(self, config: BFCLGenConfig | None = None, **overrides):
        self.config = c = dataclasses.replace(config or BFCLGenConfig(), **overrides)
        combos = compositions(c.min_calls, c.max_calls, c.max_templates)
        self.combos = {"train": [], "test": []}
        for combo in combos:
            self.combos["test" if self._in_test(combo) else "train"].append(combo)
        if not self.combos["train"] or not self.combos["test"]:
            raise ValueError(
                f"test_fraction={c.test_fraction} with seed={c.seed} leaves a split without "
                f"compositions ({len(combos)} in all); change test_fraction or seed"
            )
        self._tasks: dict[str, list[Task]] = {}

    def _in_test(self, combo) -> bool:
        key = f"{self.config.seed}:{composition_key(combo)}"
        digest = hashlib.sha1(key.encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < self.config.test_fraction

    def splits(self) -> tuple[str, ...]:
        return ("train", "test", "ood")

    def tasks(self, split: str) -> list[Task]:
        if split not in self.splits():
            raise ValueError(f"unknown split {split!r}; BFCLGenSource has {self.splits()}")
        if split not in self._tasks:
            if split == "ood":
                entries = D.load_entries(self.config.ood_category)[: self.config.ood_limit]
                self._tasks[split] = [D.entry_to_task(e, "ood") for e in entries]
            else:
                self._tasks[split] = self._generate(split)
        return list(self._tasks[split])

    def _generate(self, split: str) -> list[Task]:
        c = self.config
        n = c.num_train if split == "train" else c.num_test
        # States of the two splits come from disjoint seed streams; the composition is drawn
        # from the split's own compositions, so the split never rests on the seed alone.
        stream = 0 if split == "train" else 1
        combos = self.combos[split]
        out = []
        for i in range(n):
            rng = np.random.default_rng([c.seed, stream, i])
            combo = combos[int(rng.integers(len(combos)))]
            state_seed = int(rng.integers(2**62))
            entry = make_entry(combo, state_seed, f"gen_{split}_{i}", c.distractor_tools)
            out.append(Task(id=entry["id"], split=split, prompt=task_prompt(entry), data=entry))
        return out

    def check_disjoint(self) -> None:
        """Raise ``SplitLeakageError`` when train and test share a task id, a composition,
        an initial state or a whole request sequence."""
        checks = {
            "composition": lambda t: composition_key(t.data["composition"]),
            "initial state": lambda t: state_digest(t.data),
            "request sequence": lambda t: "\n".join(
                m["content"] for turn in t.data["question"] for m in turn
            ),
        }
        check_disjoint_splits(self, key=lambda t: t.id, splits=("train", "test"))
        for what, key in checks.items():
            seen = {key(t): t.id for t in self.tasks("train")}
            for task in self.tasks("test"):
                if key(task) in seen:
                    raise SplitLeakageError(
                        f"the {what} of test task {task.id!r} is also that of train task "
                        f"{seen[key(task)]!r}; change env.options.seed"
                    )


@functools.lru_cache(maxsize=4)
def cached_source(config: BFCLGenConfig) -> BFCLGenSource:
    return BFCLGenSource(config)
