"""Write a tiny random Qwen3 HF directory with a ChatML tokenizer, offline and deterministic: a
byte-level BPE trained on a generated corpus, weights from transformers under a fixed torch seed."""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from pathlib import Path

from .config import SHAPES

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)

CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Qwen2/3 pre-tokenizer split: letters runs, single digits, punctuation runs, whitespace.
_QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_WORDS = (
    "the a an of to and in is it that for on with as was be by this are or from at which not have "
    "what how many much number sum total answer question compute calculate add plus minus times "
    "equals result step first then so we get left right is are has had apples books coins pages "
    "please solve think carefully final user assistant system you are helpful reasoning each more "
    "less than twice half double value true false yes no if else when then because therefore"
).split()


_SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"] + "th ing er st qu".split()


def _pseudo_word(rng: random.Random) -> str:
    w = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randrange(1, 4)))
    return w.capitalize() if rng.random() < 0.2 else w


def generate_corpus(n_lines: int = 20000, seed: int = 0) -> list[str]:
    """Deterministic synthetic corpus: arithmetic, word problems, ChatML turns, plain text."""
    rng = random.Random(seed)
    lines: list[str] = []
    for _ in range(n_lines):
        kind = rng.randrange(6)
        a, b = rng.randrange(0, 1000), rng.randrange(0, 1000)
        if kind == 0:
            op = rng.choice("+-*")
            res = a + b if op == "+" else a - b if op == "-" else a * b
            lines.append(f"{a}{op}{b}={res}")
        elif kind == 1:
            lines.append(f"What is {a} + {b}? The answer is {a + b}.")
        elif kind == 2:
            words = " ".join(rng.choice(_WORDS) for _ in range(rng.randrange(4, 16)))
            lines.append(words.capitalize() + rng.choice(".?!"))
        elif kind == 3:
            lines.append(
                f"{IM_START}user\nCompute {a}*{b}.{IM_END}\n{IM_START}assistant\n"
                f"{a}*{b}={a * b}{IM_END}\n"
            )
        elif kind == 4:
            lines.append(" ".join(_pseudo_word(rng) for _ in range(rng.randrange(4, 12))) + ".")
        else:
            lines.append(
                f"#### {a - b}  ({a} - {b}) \\boxed{{{a - b}}} step {rng.randrange(10)}: {a} {b}"
            )
    return lines


def train_tokenizer(corpus: Iterable[str], vocab_size: int):
    """Byte-level BPE (Qwen-style split) with the ChatML specials at the end of the vocab."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok


def _write_tokenizer_files(tok, out: Path, model_max_length: int) -> dict[str, int]:
    tok.save(str(out / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    added = {
        str(ids[t]): {
            "content": t,
            **dict.fromkeys(("lstrip", "normalized", "rstrip", "single_word"), False),
            "special": True,
        }
        for t in SPECIAL_TOKENS
    }
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "additional_special_tokens": [IM_START, IM_END],
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "chat_template": CHATML_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2))
    specials = {k: tok_cfg[k] for k in ("eos_token", "pad_token", "additional_special_tokens")}
    (out / "special_tokens_map.json").write_text(json.dumps(specials, indent=2))
    (out / "chat_template.jinja").write_text(CHATML_TEMPLATE)
    return ids


TINY = SHAPES["tiny"]  # the dimensions `make_tiny` writes by default


def make_tiny(
    out_dir,
    *,
    seed: int = 0,
    vocab_size: int = TINY.vocab_size,
    hidden_size: int = TINY.hidden_size,
    intermediate_size: int = TINY.intermediate_size,
    num_hidden_layers: int = TINY.num_hidden_layers,
    num_attention_heads: int = TINY.num_attention_heads,
    num_key_value_heads: int = TINY.num_key_value_heads,
    head_dim: int = TINY.head_dim,
    tie_word_embeddings: bool = False,
    max_position_embeddings: int = 2048,
    rope_theta: float = 1_000_000.0,
    rms_norm_eps: float = 1e-6,
    initializer_range: float = 0.02,
    corpus: Iterable[str] | None = None,
    num_experts: int = 0,
    num_experts_per_tok: int = 2,
    moe_intermediate_size: int = 64,
    norm_topk_prob: bool = True,
) -> Path:
    """Write a tiny random Qwen3 HF directory (fp32 safetensors + ChatML tokenizer) to `out_dir`;
    `num_experts` > 0 writes a Qwen3-MoE (every layer sparse). The vocab size is the tokenizer's
    real size (BPE may produce fewer than `vocab_size`). Returns the directory path."""
    import torch
    import transformers

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lines = list(corpus) if corpus is not None else generate_corpus(seed=0)
    tok = train_tokenizer(lines, vocab_size)
    ids = _write_tokenizer_files(tok, out, max_position_embeddings)
    real_vocab = tok.get_vocab_size()

    moe = num_experts > 0
    extra = {}
    if moe:
        extra = dict(num_experts=num_experts, num_experts_per_tok=num_experts_per_tok)
        extra.update(moe_intermediate_size=moe_intermediate_size, norm_topk_prob=norm_topk_prob)
    arch = "Qwen3MoeForCausalLM" if moe else "Qwen3ForCausalLM"
    cfg = getattr(transformers, "Qwen3MoeConfig" if moe else "Qwen3Config")(
        vocab_size=real_vocab,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        head_dim=head_dim,
        tie_word_embeddings=tie_word_embeddings,
        max_position_embeddings=max_position_embeddings,
        rope_theta=rope_theta,
        rms_norm_eps=rms_norm_eps,
        initializer_range=initializer_range,
        bos_token_id=ids[ENDOFTEXT],
        eos_token_id=ids[IM_END],
        pad_token_id=ids[ENDOFTEXT],
        **extra,
    )
    cfg.architectures = [arch]
    torch.manual_seed(seed)
    model = getattr(transformers, arch)(cfg).to(torch.float32).eval()
    model.generation_config.eos_token_id = ids[IM_END]
    model.generation_config.pad_token_id = ids[ENDOFTEXT]
    model.generation_config.bos_token_id = ids[ENDOFTEXT]
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no "Writing model shards" bar in the training output
    try:
        model.save_pretrained(out)
    finally:
        if shown:
            hf_logging.enable_progress_bar()
    return out


def cli(argv: list[str]) -> int:
    import inspect

    from dlc_jax.cli_args import ArgumentParser

    p = ArgumentParser(prog="dlc-jax make-tiny", description=make_tiny.__doc__)
    p.add_argument("out_dir")
    defaults = inspect.signature(make_tiny).parameters
    for flag, key, help in (  # make_tiny's integer keywords, defaults there
        ("--seed", "seed", None),
        ("--vocab", "vocab_size", "target BPE vocab size (incl. 3 specials)"),
        ("--hidden", "hidden_size", None),
        ("--intermediate", "intermediate_size", None),
        ("--layers", "num_hidden_layers", None),
        ("--heads", "num_attention_heads", None),
        ("--kv-heads", "num_key_value_heads", None),
        ("--head-dim", "head_dim", None),
        ("--max-pos", "max_position_embeddings", None),
        ("--experts", "num_experts", "> 0: a Qwen3-MoE with this many experts"),
        ("--experts-per-tok", "num_experts_per_tok", None),
        ("--moe-intermediate", "moe_intermediate_size", None),
    ):
        default, metavar = defaults[key].default, flag[2:].upper().replace("-", "_")
        p.add_argument(flag, dest=key, type=int, default=default, help=help, metavar=metavar)
    p.add_argument(
        "--tied",
        dest="tie_word_embeddings",
        action="store_true",
        help="tie lm_head to the embedding",
    )
    print(make_tiny(**vars(p.parse_args(argv))))
    return 0
