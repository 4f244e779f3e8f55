"""The project's ChatML tokenizer (``tokenizer.kind: chatml``): exact round trips, single
special and tag tokens, digits and names the same token wherever they appear, compact
schemas, and a directory ``AutoTokenizer`` reloads with the same ids and template."""

from jaxagent.models import load_tokenizer
from jaxagent.train.tokenizer import CHATML_SPECIAL, CHATML_TEMPLATE, build_chatml_tokenizer

SCHEMA = '{"name": "price", "parameters": {"type": "object", "properties": {"item": {}}}}'
CORPUS = [f"<|im_start|>system\n{SCHEMA}<|im_end|>\ntask : what do 3 shares of acme cost ?"] * 20


def test_round_trip_special_tokens_and_digits(tmp_path):
    tok = build_chatml_tokenizer(CORPUS, 400)
    text = '<|im_start|>user\n<tool_call>\n{"name": "price", "arguments": {"a": 1207}}\n</tool_call><|im_end|>\n héllo\tworld  '
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=False) == text
    for special in CHATML_SPECIAL:
        assert len(tok.encode(special, add_special_tokens=False)) == 1, special
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    # Digits are single pieces: "1207" is 4 tokens, the same ones in any context.
    digits = [tok.convert_tokens_to_ids(d) for d in "1207"]
    assert all(d in ids for d in digits)
    assert tok.encode(" 12", add_special_tokens=False)[-2:] == digits[:2]
    # A schema that recurs verbatim merges across its punctuation (few tokens, <= 32 bytes each).
    n = len(tok.encode(SCHEMA, add_special_tokens=False))
    assert n < len(SCHEMA) / 4, n
    tok.save_pretrained(str(tmp_path))
    again = load_tokenizer(str(tmp_path))
    assert again.chat_template == CHATML_TEMPLATE
    assert again.encode(text, add_special_tokens=False) == ids
