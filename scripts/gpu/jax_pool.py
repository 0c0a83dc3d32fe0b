"""JAX served from gmr's pool through CUDA's stream-ordered pool API.

    LD_PRELOAD=$DIR/lib/libgmr-preload.so XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async \
    XLA_PYTHON_CLIENT_PREALLOCATE=false GMR_CONFIG=config/tf-growth.yaml \
    python3 jax_pool.py [--steps 20] [--seed 0] [--no-cap] [--sleep]

With XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async, XLA allocates every buffer with
cuMemAllocFromPoolAsync from cuDeviceGetDefaultMemPool's pool (or a pool of
cuMemPoolCreate), which the interposer serves from gmr (Note [Memory pools]
in lib/adapters/interpose-pools.c).  The script trains a small transformer
(plain jax.numpy, Adam written out) for --steps steps with fixed seeds and
prints one "loss" line per step, the step time, then a 1 GiB array and twenty
64 MiB arrays, and gmr's statistics read in-process (python/gmr): JAX's bytes
are allocated from gmr's pool.  Then the cap test: an array past the limit
(gmr's limit_bytes when GMR_CONFIG has one, else 1 TiB) must raise JAX's
RESOURCE_EXHAUSTED, and the process carries on.  Without the preload (the
baseline: JAX's own cuda_async) it prints the same lines, gmr's marked
"(not loaded)".  Exits 1 on a failed check.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

MiB = 1 << 20
GiB = 1 << 30
failures = []


def check(cond, what):
    print("%s - %s" % ("ok" if cond else "FAIL", what), flush=True)
    if not cond:
        failures.append(what)


def gmr_figures(gmr):
    if gmr is None:
        return None
    s = gmr.stats(0)
    keys = ("allocated_bytes", "peak_allocated_bytes", "reserved_bytes", "peak_reserved_bytes",
            "num_allocs", "num_frees", "ooms", "limit_bytes")
    return {k: s.get(k, 0) for k in keys}


def print_gmr(tag, gmr):
    f = gmr_figures(gmr)
    if f is None:
        print("gmr %s: (not loaded)" % tag)
    else:
        print("gmr %s: %s" % (tag, " ".join("%s=%d" % kv for kv in f.items())))
    return f


def process_memory_mib():
    """What nvidia-smi says this process holds on the device (MiB), or None."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(os.getpid()):
            return int(parts[1])
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-cap", action="store_true", help="skip the cap test")
    ap.add_argument("--sleep", action="store_true",
                    help="under gmr: a 256 MiB array made in gmr.region(all_threads=True) "
                         "sleeps and wakes with its contents")
    args = ap.parse_args()

    preload = "libgmr-preload" in os.environ.get("LD_PRELOAD", "")
    print("allocator %s, preallocate %s, preload %s, GMR_CONFIG %s" % (
        os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "(default)"),
        os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "(default)"), preload,
        os.environ.get("GMR_CONFIG", "(unset)")))
    import jax
    import jax.numpy as jnp

    if jax.default_backend() != "gpu":
        print("SKIP: no GPU backend (%s)" % jax.default_backend())
        return 0
    gmr = None
    if preload:
        import gmr as gmr_mod

        gmr = gmr_mod
        lib = gmr.library()
        print("gmr library: %s (%s), policy %s" % (lib.path, lib.origin, gmr.policy(0)))
    print("jax %s, device %s" % (jax.__version__, jax.devices()[0]))
    before = print_gmr("at start", gmr)

    # ---- a small transformer, Adam, fixed seeds ----
    vocab, d, heads, layers, seq, batch = 512, 512, 8, 4, 128, 16
    key = jax.random.PRNGKey(args.seed)

    def dense(k, n_in, n_out):
        return jax.random.normal(k, (n_in, n_out), jnp.float32) * (1.0 / n_in) ** 0.5

    keys = jax.random.split(key, 2 + 4 * layers)
    params = {"embed": jax.random.normal(keys[0], (vocab, d), jnp.float32) * 0.02,
              "pos": jax.random.normal(keys[1], (seq, d), jnp.float32) * 0.02, "layers": []}
    for i in range(layers):
        k = keys[2 + 4 * i: 6 + 4 * i]
        params["layers"].append({"qkv": dense(k[0], d, 3 * d), "out": dense(k[1], d, d),
                                 "up": dense(k[2], d, 4 * d), "down": dense(k[3], 4 * d, d),
                                 "ln1": jnp.ones((d,)), "ln2": jnp.ones((d,))})

    def norm(x, g):
        return g * (x - x.mean(-1, keepdims=True)) * jax.lax.rsqrt(x.var(-1, keepdims=True) + 1e-5)

    def forward(p, tokens):
        x = p["embed"][tokens] + p["pos"]
        mask = jnp.tril(jnp.ones((seq, seq), bool))
        for lp in p["layers"]:
            h = norm(x, lp["ln1"])
            q, k_, v = jnp.split(h @ lp["qkv"], 3, axis=-1)
            sh = lambda t: t.reshape(batch, seq, heads, d // heads).transpose(0, 2, 1, 3)  # noqa
            q, k_, v = sh(q), sh(k_), sh(v)
            att = jnp.where(mask, q @ k_.transpose(0, 1, 3, 2) / (d // heads) ** 0.5, -1e9)
            h = (jax.nn.softmax(att, -1) @ v).transpose(0, 2, 1, 3).reshape(batch, seq, d)
            x = x + h @ lp["out"]
            x = x + jax.nn.gelu(norm(x, lp["ln2"]) @ lp["up"]) @ lp["down"]
        return x @ p["embed"].T

    def loss_fn(p, tokens, targets):
        logits = forward(p, tokens)
        logp = jax.nn.log_softmax(logits, -1)
        return -jnp.take_along_axis(logp, targets[..., None], -1).mean()

    lr, b1, b2, eps = 3e-4, 0.9, 0.999, 1e-8

    @jax.jit
    def step(p, m, v, t, tokens, targets):
        loss, g = jax.value_and_grad(loss_fn)(p, tokens, targets)
        m = jax.tree_util.tree_map(lambda m_, g_: b1 * m_ + (1 - b1) * g_, m, g)
        v = jax.tree_util.tree_map(lambda v_, g_: b2 * v_ + (1 - b2) * g_ * g_, v, g)
        mh = jax.tree_util.tree_map(lambda m_: m_ / (1 - b1 ** t), m)
        vh = jax.tree_util.tree_map(lambda v_: v_ / (1 - b2 ** t), v)
        p = jax.tree_util.tree_map(lambda p_, a, b: p_ - lr * a / (jnp.sqrt(b) + eps), p, mh, vh)
        return p, m, v, loss

    m = jax.tree_util.tree_map(jnp.zeros_like, params)
    v = jax.tree_util.tree_map(jnp.zeros_like, params)
    n_params = sum(x.size for x in jax.tree_util.tree_leaves(params))
    state_bytes = 3 * 4 * n_params  # parameters + Adam's two moments, float32
    print("model: %d parameters, parameters + optimizer state %d bytes" % (n_params, state_bytes))
    data_key = jax.random.PRNGKey(args.seed + 1)
    times = []
    for i in range(1, args.steps + 1):
        data_key, k = jax.random.split(data_key)
        start = jax.random.randint(k, (batch, 1), 0, vocab)
        seqs = (start + jnp.arange(seq + 1)[None, :] * 7) % vocab  # learnable: +7 per token
        t0 = time.perf_counter()
        params, m, v, loss = step(params, m, v, float(i), seqs[:, :-1], seqs[:, 1:])
        loss = float(loss)  # waits for the step
        times.append(time.perf_counter() - t0)
        print("step %d loss %.9g time %.3f ms" % (i, loss, times[-1] * 1e3), flush=True)
    steady = times[1:] if len(times) > 1 else times
    print("step time (steps 2..%d): mean %.3f ms, median %.3f ms" % (
        args.steps, statistics.mean(steady) * 1e3, statistics.median(steady) * 1e3))
    after_train = print_gmr("after training", gmr)
    if after_train is not None:
        check(after_train["peak_allocated_bytes"] >= state_bytes,
              "gmr's peak allocated %d >= parameters + optimizer state %d" % (
                  after_train["peak_allocated_bytes"], state_bytes))
        check(after_train["num_allocs"] > before["num_allocs"],
              "JAX's buffers were allocated by gmr (%d allocations)" % (
                  after_train["num_allocs"] - before["num_allocs"]))

    # ---- the measurement of issue 30: a 1 GiB array and twenty 64 MiB arrays ----
    held = [jnp.ones(GiB // 4, jnp.float32)]
    held += [jnp.full(16 * MiB, float(j), jnp.float32) for j in range(20)]
    total = sum(float(x[0]) for x in held)
    check(total == 1.0 + sum(range(20)), "1 GiB + 20 x 64 MiB arrays, values right")
    arrays = print_gmr("with the arrays", gmr)
    if arrays is not None:
        grew = arrays["allocated_bytes"] - after_train["allocated_bytes"]
        check(grew >= GiB + 20 * 64 * MiB,
              "the arrays' 2.25 GiB are allocated from gmr's pool (+%d bytes)" % grew)
    used = process_memory_mib()
    if used is not None:
        print("device memory of this process (nvidia-smi): %d MiB%s" % (
            used, "" if arrays is None else ", of which gmr reserved %d MiB" % (
                arrays["reserved_bytes"] // MiB)))
    del held, total

    # ---- sleep and wake (docs/sleep-wake.md): XLA allocates on its own
    # threads, so the tag is a route of every stream (all_threads=True) ----
    if args.sleep and gmr is not None:
        with gmr.region("jax-held", all_threads=True):
            kept = jnp.arange(64 * MiB, dtype=jnp.float32)  # 256 MiB
            kept.block_until_ready()
        want = float(kept.sum())
        t = gmr.tag_info("jax-held")
        check(t["mapped_bytes"] >= 256 * MiB, "the array is in the tag (%d bytes mapped)" %
              t["mapped_bytes"])
        gmr.sleep("jax-held", mode="offload")
        t = gmr.tag_info("jax-held")
        check(t["asleep"] and t["mapped_bytes"] == 0 and t["sleeping_bytes"] >= 256 * MiB,
              "asleep, its device memory given back (%d bytes)" % t["sleeping_bytes"])
        gmr.wake("jax-held")
        check(float(kept.sum()) == want, "after the wake the array sums as before (%r)" % want)
        del kept

    # ---- the cap: past it, JAX's own error, then it carries on ----
    if not args.no_cap:
        limit = (after_train or {}).get("limit_bytes", 0)
        big = limit + 256 * MiB if limit else 1 << 40
        print("cap test: asking for %d bytes (limit %d)" % (big, limit))
        try:
            z = jnp.zeros(big, jnp.uint8)
            z.block_until_ready()
            check(False, "past the cap: RESOURCE_EXHAUSTED")
        except Exception as e:  # noqa: BLE001 (jaxlib's XlaRuntimeError / JaxRuntimeError)
            check("RESOURCE_EXHAUSTED" in str(e),
                  "past the cap: RESOURCE_EXHAUSTED (%s)" % type(e).__name__)
            print("   message: %s" % str(e).splitlines()[0][:300])
        w = jnp.arange(1000, dtype=jnp.float32)
        check(float((w * 2).sum()) == 999000.0, "JAX carries on after the error")
        params, m, v, loss = step(params, m, v, float(args.steps + 1), seqs[:, :-1], seqs[:, 1:])
        check(float(loss) == float(loss), "and trains one more step (loss %.9g)" % float(loss))
        f = print_gmr("at the end", gmr)
        if f is not None and limit:
            check(f["peak_reserved_bytes"] <= limit, "gmr's peak reserved %d <= the limit %d" % (
                f["peak_reserved_bytes"], limit))
            check(f["ooms"] >= 1, "gmr counted the refusal (ooms = %d)" % f["ooms"])
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
