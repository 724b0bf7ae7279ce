"""kernel_entry captured once into a CUDA graph and replayed: how PyTorch's baseline runs (its CUDA graph), and how an
application may run NNFusion's code, with the CPU's cost of each launch gone. kdb's harness (core/nnfusion/build.py)
adds this part when asked (`kdb nnfusion --run --cuda-graph`).

NNFusion launches everything on stream 0 and creates its cuBLAS and cuDNN handles without a stream. The legacy
default stream cannot be captured, so the project and the harness are compiled with `--default-stream per-thread`
(stream 0 is then the calling thread's default stream, which can), and the handles are set to that stream before the
capture. What cannot be captured (a synchronous copy, a second stream never joined) is said, with CUDA's error, and
the plain timing stands. The graph's outputs of its last replay are written beside the plain ones (`.graph`), for
the same check against the reference.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

GRAPH_SUFFIX = ".graph"
NVCC_FLAGS = ("--default-stream", "per-thread")
GRAPH_KEYS = ("graph_median_ms", "graph_p10_ms", "graph_p90_ms", "graph_min_ms")

# The library handles NNFusion declares at file scope in nnfusion_rt.cu (cuda_init creates them).
_HANDLE = re.compile(r"^(cublasHandle_t|cudnnHandle_t)\s+(\w+)\s*;", re.M)
_HEADERS = {"cublasHandle_t": "cublas_v2.h", "cudnnHandle_t": "cudnn.h"}
_SET_STREAM = {"cublasHandle_t": ("cublasSetStream", "CUBLAS_STATUS_SUCCESS"),
               "cudnnHandle_t": ("cudnnSetStream", "CUDNN_STATUS_SUCCESS")}


def library_handles(project: Path) -> list[tuple[str, str]]:
    """(type, name) of each cuBLAS or cuDNN handle nnfusion_rt.cu declares."""
    return _HANDLE.findall((project / "nnfusion_rt.cu").read_text(encoding="utf-8", errors="replace"))


def parse_graph(output: str) -> tuple[dict[str, float], str]:
    """The harness's graph line: (its times, '') or ({}, why there are none)."""
    for line in reversed(output.splitlines()):
        if line.startswith('{"graph_'):
            try:
                said = json.loads(line)
                if "graph_problem" in said:
                    return {}, f"not captured in a CUDA graph: {said['graph_problem']}"
                return {k: float(said[k]) for k in GRAPH_KEYS}, ""
            except (ValueError, KeyError, TypeError) as exc:
                return {}, f"the harness's graph line is unreadable ({exc}): {line[:200]}"
    return {}, "the harness printed no graph line"


def graph_section(handles: list[tuple[str, str]]) -> str:
    """The harness's `time_graph` (called after the plain timing): the handles routed to this thread's stream, the
    capture, `warmup` replays, then `iterations` timed ones, each between its own events; one JSON line, of the
    times or of why there are none."""
    includes = "".join(f"#include <{_HEADERS[t]}>\n" for t in sorted({t for t, _ in handles}))
    declared = "".join(f"extern {t} {name};\n" for t, name in handles)
    routed = "".join(
        f'    if ({_SET_STREAM[t][0]}({name}, cudaStreamPerThread) != {_SET_STREAM[t][1]}) {{\n'
        f'        printf("{{\\"graph_problem\\": \\"{_SET_STREAM[t][0]}({name}) failed\\"}}\\n");\n'
        f"        return 0;\n    }}\n" for t, name in handles)
    return _GRAPH.replace("@INCLUDES@", includes).replace("@DECLARED@", declared).replace("@ROUTED@", routed)


_GRAPH = r"""
// kernel_entry captured into a CUDA graph and replayed (core/nnfusion/cuda_graph.py)
@INCLUDES@@DECLARED@
static int graph_problem(const char* what, cudaError_t e) {  // the plain timing stands: exit 0
    cudaGetLastError();  // (a failed capture leaves its error behind)
    printf("{\"graph_problem\": \"%s: %s\"}\n", what, cudaGetErrorName(e));
    return 0;
}

static int time_graph(void** device, int warmup, int iterations, char** outputs) {
@ROUTED@    cudaStream_t s = cudaStreamPerThread;
    CHECK(cudaDeviceSynchronize());
    cudaGraph_t graph = nullptr;
    cudaError_t e = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) return graph_problem("cudaStreamBeginCapture", e);
    int status = entry(device);
    e = cudaStreamEndCapture(s, &graph);
    if (status != 0 && e == cudaSuccess) e = cudaErrorUnknown;
    if (e != cudaSuccess) {
        if (graph) cudaGraphDestroy(graph);
        return graph_problem("kernel_entry could not be captured", e);
    }
    cudaGraphExec_t exec = nullptr;
    e = cudaGraphInstantiate(&exec, graph, 0);
    if (e != cudaSuccess) {
        cudaGraphDestroy(graph);
        return graph_problem("cudaGraphInstantiate", e);
    }
    for (int i = 0; i < warmup; ++i) CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    std::vector<cudaEvent_t> events(2 * iterations);
    for (auto& ev : events) CHECK(cudaEventCreate(&ev));
    for (int i = 0; i < iterations; ++i) {
        cudaEventRecord(events[2 * i], s);
        cudaGraphLaunch(exec, s);
        cudaEventRecord(events[2 * i + 1], s);
    }
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaGetLastError());
    std::vector<float> ms(iterations);
    for (int i = 0; i < iterations; ++i) CHECK(cudaEventElapsedTime(&ms[i], events[2 * i], events[2 * i + 1]));
    for (auto& ev : events) cudaEventDestroy(ev);
    for (int j = 0; j < N_OUT; ++j) {
        std::vector<char> host(BYTES[N_IN + j]);
        CHECK(cudaMemcpy(host.data(), device[N_IN + j], BYTES[N_IN + j], cudaMemcpyDeviceToHost));
        std::string path = std::string(outputs[j]) + "@SUFFIX@";
        FILE* f = fopen(path.c_str(), "wb");
        if (!f || fwrite(host.data(), 1, host.size(), f) != host.size()) {
            fprintf(stderr, "kdb harness: cannot write %s\n", path.c_str());
            return KDB_BAD_INPUT;
        }
        fclose(f);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    std::sort(ms.begin(), ms.end());
    printf("{\"graph_median_ms\": %.6f, \"graph_p10_ms\": %.6f, \"graph_p90_ms\": %.6f, \"graph_min_ms\": %.6f}\n",
           iterations % 2 ? ms[iterations / 2] : 0.5f * (ms[iterations / 2 - 1] + ms[iterations / 2]),
           ms[iterations / 10], ms[(iterations * 9) / 10], ms[0]);
    return 0;
}
""".replace("@SUFFIX@", GRAPH_SUFFIX)
