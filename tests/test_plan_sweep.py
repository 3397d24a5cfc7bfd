"""`tailgate bench --sweep`: the highest rate meeting the SLOs, against a server of known
capacity (one request at a time, 10 ms each: 100 requests/s), and the search on its own."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading

import pytest

from tailgate.plan import sweep
from tailgate.report import sweep_render

SERVICE_S = 0.010  # capacity: 100 requests/s


class SerialServer:
    """HTTP/1.1 keep-alive on loopback that serves one request at a time, 10 ms each."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.served = 0
        ready = threading.Event()
        self.thread = threading.Thread(target=self._main, args=(ready,), daemon=True)
        self.thread.start()
        assert ready.wait(10)

    def _main(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        lock = asyncio.Lock()

        async def handle(reader, writer):
            try:
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    if not head:
                        break
                    async with lock:  # one at a time: a queue forms beyond 100/s
                        await asyncio.sleep(SERVICE_S)
                        self.served += 1
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n")
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()

        async def start():
            self.server = await asyncio.start_server(handle, "127.0.0.1", 0)
            self.port = self.server.sockets[0].getsockname()[1]
            ready.set()

        self.loop.run_until_complete(start())
        self.loop.run_forever()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def test_sweep_finds_the_capacity_of_a_serial_server(tmp_path):
    srv = SerialServer()
    try:
        r = subprocess.run(
            [sys.executable, "-m", "tailgate", "bench", f"http://127.0.0.1:{srv.port}/",
             "--sweep", "25..400", "--sweep-steps", "5", "--sweep-bisect", "2",
             # 2 s: at 25/s that is 50 samples, enough for a P90 with a 95 % interval (35);
             # an SLO on a percentile that is not measurable fails
             "--duration", "2s", "--workers", "1", "--connections", "4", "--timeout", "3s",
             "--slo", "p90<500ms", "--json", str(tmp_path / "sweep.json"),
             "--sweep-html", str(tmp_path / "sweep.html")],
            capture_output=True, text=True, timeout=120, check=False)
    finally:
        srv.stop()
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads((tmp_path / "sweep.json").read_text())
    rates = [p["rate"] for p in data["points"]]
    assert rates == sorted(rates) and rates[0] == pytest.approx(25)
    top = data["max_rate_meeting_slo"]
    # a quarter of the capacity holds (a 500 ms p90 leaves room for a loaded test machine);
    # 200/s is twice the capacity: the queue grows by 100 requests a second, so latency
    # climbs to about two seconds within the run and its p90 to about 1.8 s
    assert top is not None and 25 <= top["rate"] < 200, rates
    failing = [p for p in data["points"] if not p["holds"]]
    assert failing and min(p["rate"] for p in failing) > top["rate"]
    assert max(rates) <= 200 * 1.001  # stepping stopped at the first failure (no 400/s run)
    assert "highest rate meeting every SLO" in r.stdout
    assert "Plotly.newPlot" in (tmp_path / "sweep.html").read_text()
    # the saved sweep shows again: its points read back as they were written
    assert [sweep.Point.from_json(p).to_json() for p in data["points"]] == data["points"]
    again = subprocess.run([sys.executable, "-m", "tailgate", "report", str(tmp_path / "sweep.json")],
                           capture_output=True, text=True, timeout=60, check=False)
    assert again.returncode == 0, again.stderr
    assert "highest rate meeting every SLO" in again.stdout


def P(rate, achieved, p99, ok=True):  # noqa: N802 - a table row
    return sweep.Point(rate, achieved, p99 / 2, p99, p99 * 2, ok, achieved >= 0.95 * rate)


def test_search_steps_then_bisects():
    capacity = 1000.0
    seen = []

    def measure(rate):  # a pure model of a server: holds below its capacity
        seen.append(rate)
        return P(rate, min(rate, capacity), 1.0 if rate <= capacity else 50.0,
                 ok=rate <= capacity)

    points = sweep.search(measure, 100, 10_000, 5, 6)
    # steps 100, 316, 1000, 3162 (fails: stop, 10000 never run), then 6 bisections
    assert seen[:4] == pytest.approx([100, 316.23, 1000, 3162.28], rel=1e-3)
    assert 10_000 not in seen and len(seen) == 10
    top = sweep.best(points)
    assert 1000 <= top.rate <= capacity * 1.0001
    # a rate the generator could not sustain does not hold, whatever the SLOs say
    assert not P(100, 80, 1.0).holds


def test_llm_points_are_sustained_by_lateness_not_by_span():
    """A long generation stretches an openai+ run's span (first send to last response), so
    its "achieved" rate falls short of the offered one even when every request went out on
    time; the generator's lateness is what says the rate was held."""
    base = {"rate": {"target": 2, "achieved": 1.03}, "latency_ms": {"p99": 9000.0},
            "throughput": {"output_tokens_per_s": 40.0, "goodput_rps": 1.0}, "slo": []}
    on_time = sweep.point_from_result(2.0, {**base, "lateness_ms": {"p99": 3.0}})
    behind = sweep.point_from_result(2.0, {**base, "lateness_ms": {"p99": 900.0}})
    assert on_time.holds and not behind.holds
    http = sweep.point_from_result(1000.0, {"rate": {"achieved": 900.0}, "latency_ms": {}})
    assert not http.sustained


def test_knee_is_where_latency_turns_up():
    pts = [P(r, a, p) for r, a, p in ((100, 100, 1.0), (200, 200, 1.1), (400, 400, 1.3),
                                      (800, 790, 2.0), (1600, 900, 80.0))]
    assert sweep.knee(pts).rate == 800
    assert sweep.knee(pts[:2]) is None


def test_bad_sweep_range():
    from tailgate.bench.units import parse_rate

    with pytest.raises(sweep.SweepError, match="LO..HI"):
        sweep.parse_range("1000", parse_rate)
    with pytest.raises(sweep.SweepError, match="0 < LO < HI"):
        sweep.parse_range("5k..1k", parse_rate)
    assert sweep.parse_range("1k..50k", parse_rate) == (1000, 50_000)


def test_sweep_of_an_llm_target_reports_decode_throughput_at_the_slo(tmp_path):
    """openai+ targets sweep the same way; each point carries output tokens/s and goodput
    (a scripted OpenAI-compatible server on loopback: 8 tokens, 1 ms apart)."""
    from support.llm_server import ScriptedServer

    with ScriptedServer() as srv:
        r = subprocess.run(
            [sys.executable, "-m", "tailgate", "bench", f"openai+{srv.base}", "--model", "m",
             "--sweep", "2..8", "--sweep-steps", "2", "--requests", "12", "--output-len", "8",
             "--slo", "ttft_p99<5s", "--slo", "error_rate<1%", "--json", "-"],
            capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert [p["rate"] for p in data["points"]] == pytest.approx([2, 8])
    top = data["max_rate_meeting_slo"]
    assert top["rate"] == pytest.approx(8)
    # 12 requests of 8 tokens each, sent at 8/s: output tokens/s near 8 * 8
    assert 20 < top["output_tokens_per_s"] < 200 and top["goodput_rps"] > 0


def test_a_knee_is_reported_only_where_the_curve_saturated():
    # flat and sustained to the top: Kneedle's candidate is noise (here the last point)
    flat = [P(r, r, p) for r, p in ((100, 1.00), (200, 1.05), (400, 0.98), (800, 1.02),
                                     (1600, 1.01))]
    assert sweep.knee(flat) is not None
    k, why = sweep.knee_of(flat)
    assert k is None and why.startswith("no knee: nothing saturated up to 1,600.0/s")
    text = sweep_render.summary(flat, None, k, False, why)
    assert "\nknee:" not in text and text.endswith(why)
    # the bend with a rate beyond it that was not sustained: a knee, with its evidence
    bend = [P(r, a, p) for r, a, p in ((100, 100, 1.0), (200, 200, 1.1), (400, 400, 1.3),
                                       (800, 790, 2.0), (1600, 900, 80.0))]
    k, why = sweep.knee_of(bend)
    assert k.rate == 800 and why == "1,600.0/s offered was not sustained (900.0/s achieved)"
    # sustained, but the P99 beyond it more than doubled: saturation too
    rising = [P(r, r, p) for r, p in ((100, 1.0), (200, 1.1), (400, 1.3), (800, 2.0),
                                      (1600, 9.0))]
    k, why = sweep.knee_of(rising)
    assert k.rate == 800 and why.startswith("p99 9.000 ms at 1,600.0/s, 4.5x")
