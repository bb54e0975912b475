"""The vLLM worker's rows against vLLM's own lists. `assert_rows_are_vllms` runs this file in a process of its own
(`python vllm_own_lists.py MODEL OUT [GPU_SHARE]`, the worker's environment): one vLLM worker engine (float32, on the
CPU, or on a GPU taking GPU_SHARE of its memory), one batch through the worker's `generate`, then the same batch
through vLLM's own output processor, whose logprob lists are read here as the worker read them before it took vLLM's
arrays instead; both pickled to OUT, then compared.

A target asks for the whole vocabulary ("full"), another for its digest, the fillers for 5 logprobs each; every
request arrives at step 0 under the engine's own budget, so both runs schedule the same passes.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from oracle.engines.contract import Request, SamplingParams
from oracle.engines.vllm_worker import WorkerEngine, WorkerSpec, _sampling_params

# The vLLM worker's own settings (oracle.engines.vllm_engine): its engine in the process, one thread.
WORKER_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1",
              "TOKENIZERS_PARALLELISM": "false"}

LOGPROBS = 5


def requests(vocab: int) -> list[Request]:
    rng = random.Random(3)
    fillers = [Request(f"f{i}", tuple(rng.randrange(vocab) for _ in range(rng.randint(3, 40))),
                       SamplingParams(max_tokens=rng.randint(2, 7), logits="none")) for i in range(10)]
    full = Request("full", tuple(rng.randrange(vocab) for _ in range(30)), SamplingParams(max_tokens=6, logits="full"))
    digest = Request("digest", tuple(rng.randrange(vocab) for _ in range(12)),
                     SamplingParams(max_tokens=5, logits="digest"))
    return fillers[:4] + [full] + fillers[4:7] + [digest] + fillers[7:]


def vllms_own_lists(engine: WorkerEngine, reqs: list[Request]) -> dict[str, dict[str, Any]]:
    """Each request's tokens, logprobs, top-2 and rows as vLLM's `RequestOutput` lists give them."""
    del engine.engine.output_processor.process_outputs  # vLLM's own method again, logprobs and all
    by_id = {f"again-{r.request_id}": r for r in reqs}  # RequestOutput carries the id it was added under
    for rid, r in by_id.items():
        engine.engine.add_request(rid, {"prompt_token_ids": list(r.prompt_token_ids)},
                                  _sampling_params(r.sampling, LOGPROBS))
    out: dict[str, dict[str, Any]] = {r.request_id: {"tokens": [], "logprobs": [], "top2": [], "rows": []}
                                      for r in reqs}
    while engine.engine.has_unfinished_requests():
        for o in engine.engine.step():
            r = by_id[o.request_id]
            got = out[r.request_id]
            c = o.outputs[0]
            lp = c.logprobs  # FlatLogprobs of this step's new tokens
            for j, token in enumerate(c.token_ids):
                lo, hi = lp.start_indices[j], lp.end_indices[j]
                tids = np.asarray(lp.token_ids[lo:hi], dtype=np.int64)
                vals = np.asarray(lp.logprobs[lo:hi], dtype=np.float32)
                got["tokens"].append(int(token))
                got["logprobs"].append(float(vals[np.flatnonzero(tids == token)[0]]))
                if r.sampling.logits == "none":
                    _, first = np.unique(tids, return_index=True)
                    best = np.sort(vals[first])[::-1]
                    got["top2"].append((float(best[0]), float(best[1])))
                else:
                    row = np.full(engine.vocab_size, -np.inf, dtype=np.float32)
                    row[tids] = vals
                    top = np.partition(row, -2)[-2:]
                    got["top2"].append((float(top[1]), float(top[0])))
                    got["rows"].append(row.tobytes())
    return out


def assert_rows_are_vllms(model: Path, tmp_path: Path, gpu_share: float | None = None) -> None:
    """This file run on `model`: every request's tokens, logprobs, top-2, full rows and digests as the worker gives
    them equal, bit for bit, what vLLM's own lists hold."""
    out = tmp_path / "rows.pkl"
    share = [] if gpu_share is None else [str(gpu_share)]
    done = subprocess.run([sys.executable, __file__, str(model), str(out), *share], env={**os.environ, **WORKER_ENV},
                          cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    got = pickle.loads(out.read_bytes())
    worker, own = got["worker"], got["vllm"]
    assert worker.keys() == own.keys() and len(worker) == 12
    assert sum(len(w["rows"]) for w in worker.values()) == 6 and len(worker["digest"]["digests"]) == 5
    for rid, w in worker.items():
        assert len(w["tokens"]) > 0
        assert w == own[rid], rid


def main(model: str, path: str, gpu_share: str | None = None) -> None:
    engine_args = {"gpu_memory_utilization": float(gpu_share)} if gpu_share else {}
    engine = WorkerEngine(WorkerSpec(
        model=model, mode="production", invariance="none", dtype="float32", max_num_seqs=16,
        max_num_batched_tokens=64, enable_chunked_prefill=True, enable_prefix_caching=False, logprobs=LOGPROBS,
        enforce_eager=True, max_model_len=256, seed=0, audit=False, engine_args=engine_args))
    reqs = requests(engine.vocab_size)
    worker = {}
    for r, c in zip(reqs, engine.generate(reqs, None), strict=True):
        rows = [row.tobytes() for row in c.logits] if c.logits is not None else []
        worker[r.request_id] = {"tokens": c.token_ids, "logprobs": c.logprobs, "top2": c.top2, "rows": rows,
                                "digests": c.logits_digests}
    own = vllms_own_lists(engine, reqs)
    for r in reqs:  # the digest target's rows become digests, as the worker makes them
        if r.sampling.logits == "digest":
            own[r.request_id]["digests"] = [hashlib.sha256(row).hexdigest() for row in own[r.request_id]["rows"]]
            own[r.request_id]["rows"] = []
        else:
            own[r.request_id]["digests"] = None
    with open(path, "wb") as f:
        pickle.dump({"worker": worker, "vllm": own}, f)
    engine.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:4])
    sys.stdout.flush()
    os._exit(0)
