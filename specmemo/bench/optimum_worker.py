"""Hugging Face's own ONNX route, one job: run by `specmemo bench front --optimum` with the python of optimum-onnx's
venv (bench/optimum.py), never imported by SpecMemo (it imports optimum, transformers, onnxruntime and the standard
library only).

    python optimum_worker.py JOB.json OUT.json

build:    {"kind": "build", "gguf": file, "out": folder, "dtypes": ["fp32", "int8", "int8-channel"]}
          The GGUF loaded by transformers 4.x (a folder saved by transformers 5 does not load there), exported by
          optimum's `main_export` (ORTModelForCausalLM's export) into out/fp32, and quantized by `ORTQuantizer` with
          optimum's dynamic AVX-512 VNNI configuration (int8 weights, activations quantized at run time): one scale
          per tensor (the configuration optimum's documentation shows) into out/int8, one per output channel into
          out/int8-channel.
          OUT: {"seconds": {"convert", "fp32", "int8"}}
generate: {"kind": "generate", "model_dir": folder, "file_name": "model.onnx", "prompts": [[ids]],
           "max_new_tokens": n, "eos": [ids], "threads": 2}
          Greedy `generate` per prompt, as an app using optimum would call it; the time of each token is taken by a
          logits processor (called once per new token, after the forward that made its logits).
          OUT: compare.py's engine result: {"engine", "load_s", "rss_after_load", "peak_rss", "turns": [{"token_ids",
          "ttft_s", "wall_s"}]}
"""

from __future__ import annotations

import json
import resource
import sys
import tempfile
import time
from pathlib import Path


def build(job: dict) -> dict:
    from optimum.exporters.onnx import main_export
    from optimum.onnxruntime import ORTModelForCausalLM, ORTQuantizer
    from optimum.onnxruntime.configuration import AutoQuantizationConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf, out = Path(job["gguf"]), Path(job["out"])
    seconds = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as hf:
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, torch_dtype="float32")
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model.save_pretrained(hf)
        tokenizer.save_pretrained(hf)
        del model
        seconds["convert"] = time.perf_counter() - started
        started = time.perf_counter()
        # what ORTModelForCausalLM.from_pretrained(export=True) runs, less its validation (a second float32 copy of
        # the model in an ONNX Runtime session beside the PyTorch one)
        main_export(hf, out / "fp32", task="text-generation-with-past", do_validation=False)
        tokenizer.save_pretrained(out / "fp32")
        ORTModelForCausalLM.from_pretrained(out / "fp32")  # the export loads as optimum's own class
        seconds["fp32"] = time.perf_counter() - started
    for dtype, per_channel in (("int8", False), ("int8-channel", True)):
        if dtype in job["dtypes"]:
            started = time.perf_counter()
            config = AutoQuantizationConfig.avx512_vnni(is_static=False, per_channel=per_channel)
            ORTQuantizer.from_pretrained(out / "fp32").quantize(save_dir=out / dtype, quantization_config=config)
            seconds[dtype] = time.perf_counter() - started
    return {"seconds": seconds}


def generate(job: dict) -> dict:
    import onnxruntime
    import torch
    from optimum.onnxruntime import ORTModelForCausalLM
    from transformers import LogitsProcessor, LogitsProcessorList

    threads = job["threads"]
    torch.set_num_threads(threads)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    started = time.perf_counter()
    model = ORTModelForCausalLM.from_pretrained(job["model_dir"], file_name=job["file_name"], session_options=options,
                                                use_cache=True)
    load_s = time.perf_counter() - started
    after_load = _rss()

    class Clock(LogitsProcessor):
        def __init__(self):
            self.times = []

        def __call__(self, input_ids, scores):
            self.times.append(time.perf_counter())
            return scores

    turns = []
    for prompt in job["prompts"]:
        clock = Clock()
        ids = torch.tensor([prompt])
        started = time.perf_counter()
        output = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                max_new_tokens=job["max_new_tokens"], eos_token_id=job["eos"],
                                pad_token_id=job["eos"][0], logits_processor=LogitsProcessorList([clock]))
        wall = time.perf_counter() - started
        turns.append({"token_ids": output[0, len(prompt):].tolist(), "ttft_s": clock.times[0] - started,
                      "wall_s": wall})
    return {"engine": "optimum", "load_s": load_s, "rss_after_load": after_load, "peak_rss": _peak(), "turns": turns}


def _rss() -> int:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS"))
    return int(line.split()[1]) * 1024


def _peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main(job_file: str, out_file: str) -> int:
    job = json.loads(Path(job_file).read_text())
    result = build(job) if job["kind"] == "build" else generate(job)
    Path(out_file).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(f"usage: {sys.argv[0]} JOB.json OUT.json", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(*sys.argv[1:]))
