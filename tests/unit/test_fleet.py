"""The fleet view's readings (scheduler/dispatch/fleet.py): DCGM answers no GPU could give are refused naming the GPU."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    ("used", "free", "match"),
    [
        ("NaN", "1024", "reports nan GiB used"),
        ("1024", "+Inf", "reports 1 GiB used and inf GiB free"),
        ("-81920", "1024", "reports -80 GiB used"),
        ("1e12", "0", "totalling at most 4096 GiB"),
    ],
)
def test_dcgm_answers_no_gpu_could_give_are_refused_naming_the_gpu(used, free, match):
    """Prometheus's answers are input too: a real HTTP server answering as Prometheus's query API."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer
    from urllib.parse import parse_qs, urlsplit

    from scheduler.dispatch.fleet import dcgm_gpus

    values = {"DCGM_FI_DEV_FB_USED": used, "DCGM_FI_DEV_FB_FREE": free, "DCGM_FI_DEV_GPU_UTIL": "NaN"}

    class Prometheus(BaseHTTPRequestHandler):
        def do_GET(self):
            query = parse_qs(urlsplit(self.path).query)["query"][0]
            sample = {"metric": {"UUID": "GPU-51b", "Hostname": "node-a", "modelName": "H100"}, "value": [0, values[query]]}
            body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [sample]}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Prometheus)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        with pytest.raises(ValueError, match=rf"DCGM at {url}: GPU GPU-51b .*{match}"):
            dcgm_gpus(url)
        values.update(DCGM_FI_DEV_FB_USED="1024", DCGM_FI_DEV_FB_FREE="80896")  # a sane answer, NaN utilization
        (gpu,) = dcgm_gpus(url)
        assert gpu.total_gib == 80 and gpu.observed_used_gib == 1 and gpu.observed_util is None
    finally:
        server.shutdown()
