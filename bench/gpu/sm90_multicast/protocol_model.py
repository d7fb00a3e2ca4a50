"""Randomised model of the sm90 forward's barrier protocol with clusters of two CTAs (one pipeline per CTA; the
pipelines of a CTA share nothing), to look for logical deadlocks and data races. Producers and consumer warps
are generators that follow produce(), consume() and TileSequence step by step. mbarriers have phases, pending
arrivals and transaction counts. TMA loads (multicast into both CTAs) and arrivals on another CTA's barriers are
events delivered after random delays. Every read of a K / V slot checks that it holds both halves of the
expected key tile, before and after the product that reads it. Causal tiles of 1-4 key tiles are claimed from a
counter shared by two clusters.

    python3 bench/gpu/sm90_multicast/protocol_model.py [SEEDS]

Session 11: 600 runs (200 seeds x delays 3 / 30 / 300) found no deadlock and no race. A K/V empty count of 4
(this CTA's warps only) is caught as a race in every seed, and a tile_empty count of 8 as a deadlock. So the
hang seen on the GPU is not in the protocol as written: look at what the model leaves out (memory ordering of
the CTA-scope releases, the exit, register-level code).
"""
import random
import sys

STAGES, RING, WARPS, CTAS = 2, 2, 4, 2
KV_BYTES, Q_BYTES = 2, 1  # K/V: one unit per CTA's half


class Barrier:
    def __init__(self, name, count):
        self.name, self.count, self.pending, self.tx, self.phase = name, count, count, 0, 0

    def _maybe_complete(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def arrive(self, expect_tx=0):
        assert self.pending > 0, f"{self.name}: arrival beyond count"
        self.tx += expect_tx
        self.pending -= 1
        self._maybe_complete()

    def complete_tx(self, n):
        self.tx -= n
        self._maybe_complete()

    def passed(self, parity):  # try_wait.parity
        return (self.phase & 1) != parity


class Cta:
    def __init__(self, rank):
        self.q_full, self.q_empty = Barrier(f"r{rank}.q_full", 1), Barrier(f"r{rank}.q_empty", WARPS)
        self.full = {kv: [Barrier(f"r{rank}.{kv}_full{s}", 1) for s in range(STAGES)] for kv in "KV"}
        self.empty = {kv: [Barrier(f"r{rank}.{kv}_empty{s}", WARPS * CTAS) for s in range(STAGES)] for kv in "KV"}
        self.tile_full = [Barrier(f"r{rank}.tile_full{i}", 1) for i in range(RING)]
        self.tile_empty = [Barrier(f"r{rank}.tile_empty{i}", WARPS * CTAS + CTAS - 1 if rank == 0 else 1)
                           for i in range(RING)]
        self.tile_slot = [None] * RING
        self.slot = {kv: [dict() for _ in range(STAGES)] for kv in "KV"}  # half -> (tile, n)
        self.q = None


class Sim:
    def __init__(self, seed, clusters, num_tiles, m_tiles, max_delay):
        self.rng = random.Random(seed)
        self.clusters, self.num_tiles, self.m_tiles, self.max_delay = clusters, num_tiles, m_tiles, max_delay
        self.counter = 0
        self.events = []  # (due step, fn, label)
        self.step = 0

    def later(self, fn, label):
        self.events.append((self.step + self.rng.randint(1, self.max_delay), fn, label))

    def key_tiles(self, tile):
        return (self.m_tiles - 1 - tile % self.m_tiles) + 1  # causal, heaviest first: key tiles [0, n)


def ring_pos():
    return [0, 0]  # index, phase


def advance(p):
    p[0] += 1
    if p[0] == STAGES:
        p[0], p[1] = 0, p[1] ^ 1


def producer(sim, cl, rank):
    ctas = cl
    me = ctas[rank]
    tile, posts = cl.id, 0
    pos, q_phase = ring_pos(), 0
    first_claim = sim.clusters
    while tile < sim.num_tiles:
        n_end = sim.key_tiles(tile)

        def load(kv, n, at):
            yield ("wait", me.empty[kv][at[0]], at[1] ^ 1)
            me.full[kv][at[0]].arrive(expect_tx=KV_BYTES)
            for d in range(CTAS):  # multicast of this CTA's half into every CTA
                dst = ctas[d]
                s = at[0]

                def deliver(dst=dst, s=s, kv=kv, n=n, t=tile):
                    dst.slot[kv][s][rank] = (t, n)
                    dst.full[kv][s].complete_tx(1)
                sim.later(deliver, f"tma {kv}{n} r{rank}->r{d}")

        yield from load("K", n_end - 1, pos)
        yield ("wait", me.q_empty, q_phase ^ 1)
        me.q_full.arrive(expect_tx=Q_BYTES)

        def deliver_q(t=tile):
            me.q = t
            me.q_full.complete_tx(1)
        sim.later(deliver_q, "tma q")
        q_phase ^= 1
        for n in range(n_end - 1, -1, -1):
            nxt = list(pos)
            advance(nxt)
            if n > 0:
                yield from load("K", n - 1, nxt)
            yield from load("V", n, pos)
            pos = nxt
        # next_for_producer
        slot, parity = posts % RING, (posts // RING) & 1
        if rank == 0:
            tile = first_claim + sim.counter
            sim.counter += 1
            yield ("wait", me.tile_empty[slot], parity ^ 1)
            me.tile_slot[slot] = tile
            me.tile_full[slot].arrive()
            other = ctas[1]

            def post(other=other, slot=slot, t=tile):
                other.tile_slot[slot] = t
                other.tile_full[slot].arrive()
            sim.later(post, "post")
        else:
            yield ("wait", me.tile_full[slot], parity)
            tile = me.tile_slot[slot]
            t0 = ctas[0]
            sim.later(lambda slot=slot: t0.tile_empty[slot].arrive(), "p1 read")
        posts += 1
        yield ("step",)


def consumer(sim, cl, rank, warp):
    ctas = cl
    me = ctas[rank]
    tile, posts = cl.id, 0
    pos, q_phase = ring_pos(), 0
    first_claim = sim.clusters

    def release(kv, s):
        for d in range(CTAS):
            b = ctas[d].empty[kv][s]
            if d == rank:
                b.arrive()
            else:
                sim.later(lambda b=b: b.arrive(), f"release {kv}{s} r{rank}->r{d}")

    def check(kv, s, t, n):
        got = me.slot[kv][s]
        assert got == {0: (t, n), 1: (t, n)}, f"r{rank}w{warp} tile {t}: {kv}{n} slot {s} holds {got}"

    while tile < sim.num_tiles:
        n_end = sim.key_tiles(tile)
        yield ("wait", me.q_full, q_phase)
        assert me.q == tile, f"q holds {me.q}, want {tile}"
        q_phase ^= 1
        yield ("wait", me.full["K"][pos[0]], pos[1])
        check("K", pos[0], tile, n_end - 1)
        yield ("step",)  # S in flight
        check("K", pos[0], tile, n_end - 1)
        release("K", pos[0])
        if n_end - 1 == 0:
            me.q_empty.arrive()
        prev, prev_phase = pos[0], pos[1]
        advance(pos)
        for n in range(n_end - 2, -1, -1):
            yield ("wait", me.full["K"][pos[0]], pos[1])
            yield ("wait", me.full["V"][prev], prev_phase)
            check("K", pos[0], tile, n)
            check("V", prev, tile, n + 1)
            yield ("step",)
            check("K", pos[0], tile, n)
            release("K", pos[0])
            if n == 0:
                me.q_empty.arrive()
            check("V", prev, tile, n + 1)
            release("V", prev)
            prev, prev_phase = pos[0], pos[1]
            advance(pos)
        yield ("wait", me.full["V"][prev], prev_phase)
        check("V", prev, tile, 0)
        yield ("step",)
        check("V", prev, tile, 0)
        release("V", prev)
        # next_for_consumer
        slot, parity = posts % RING, (posts // RING) & 1
        yield ("wait", me.tile_full[slot], parity)
        tile = me.tile_slot[slot]
        if rank == 0:  # every warp's leader arrives
            me.tile_empty[slot].arrive()
        else:
            t0 = ctas[0]
            sim.later(lambda slot=slot: t0.tile_empty[slot].arrive(), "c read")
        posts += 1


class Cluster(list):
    pass


def run(seed, clusters=2, num_tiles=40, m_tiles=4, max_delay=30, max_steps=200000):
    sim = Sim(seed, clusters, num_tiles, m_tiles, max_delay)
    agents = []
    for c in range(clusters):
        cl = Cluster([Cta(0), Cta(1)])
        cl.id = c
        for r in range(CTAS):
            agents.append((f"c{c}p{r}", producer(sim, cl, r)))
            for w in range(WARPS):
                agents.append((f"c{c}r{r}w{w}", consumer(sim, cl, r, w)))
    state = {name: ("step",) for name, _ in agents}
    gens = dict(agents)
    done = set()
    while sim.step < max_steps:
        sim.step += 1
        runnable = [n for n in gens if n not in done and
                    (state[n][0] == "step" or state[n][1].passed(state[n][2]))]
        due = [e for e in sim.events if e[0] <= sim.step]
        choices = runnable + [("event", e) for e in due]
        if not choices:
            if not sim.events:
                if len(done) == len(gens):
                    return None
                stuck = {n: (state[n][1].name, state[n][2]) for n in gens if n not in done}
                return f"seed {seed}: deadlock at step {sim.step}: {stuck}"
            continue
        pick = sim.rng.choice(choices)
        if isinstance(pick, tuple):
            e = pick[1]
            sim.events.remove(e)
            e[1]()
            continue
        try:
            state[pick] = next(gens[pick])
        except StopIteration:
            done.add(pick)
    return f"seed {seed}: no end after {max_steps} steps"


if __name__ == "__main__":
    seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    bad = 0
    for seed in range(seeds):
        for delay in (3, 30, 300):
            try:
                r = run(seed, max_delay=delay)
            except AssertionError as e:
                r = f"seed {seed} delay {delay}: {e}"
            if r:
                bad += 1
                print(r)
                if bad > 5:
                    sys.exit(1)
    print(f"{seeds * 3} runs, {bad} bad")
