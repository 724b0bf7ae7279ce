"""On the GPU: each default-schedule kernel (new: block per output where few outputs; old: thread per output)
against PyTorch's library call (cuDNN/cuBLAS, fp32, TF32 off), all captured in CUDA graphs; median of rounds."""
import ctypes, json, statistics, sys
import torch
import torch.nn.functional as F
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
lib = ctypes.CDLL(sys.argv[1] + "/defaults.so")
cases = json.load(open(sys.argv[1] + "/cases.json"))
REPS, ROUNDS = 20, 15

def dims(line, key):
    return [tuple(int(d) for d in f[len(key):].split("_")) for f in line.split("|") if f.startswith(key)]

def graph_us(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(REPS):
            fn()
    g.replay(); torch.cuda.synchronize()
    times = []
    for _ in range(ROUNDS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1000 / REPS)
    return statistics.median(times)

print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  fp32, TF32 off, CUDA graph of {REPS}, median of {ROUNDS}")
print(f"{'case':28} {'library us':>10} {'new us':>9} {'new/lib':>8} {'old us':>9} {'old/lib':>8} {'err new':>8} {'err old':>8}")
for name, c in cases.items():
    line = c["line"]
    torch.manual_seed(0)
    if "pool" in line:
        (ishape,) = dims(line, "i+"); (oshape,) = dims(line, "o+")
        x = torch.randn(ishape, device="cuda")
        op = F.avg_pool2d if "avgpool" in line else F.max_pool2d
        ins = [x]; lib_fn = lambda: op(x, ishape[2:])
    elif "dot" in line:
        (a,) = dims(line, "a+"); (b,) = dims(line, "b+"); (oshape,) = dims(line, "o+")
        A = torch.randn(a, device="cuda"); B = torch.randn(b, device="cuda")
        tb = "tb+1" in line
        ins = [A, B]; lib_fn = (lambda: A @ B.t()) if tb else (lambda: A @ B)
    else:
        (ishape,) = dims(line, "i+"); (wshape,) = dims(line, "w+"); (oshape,) = dims(line, "o+"); (pad,) = dims(line, "p+")
        x = torch.randn(ishape, device="cuda"); w = torch.randn(wshape, device="cuda")
        ins = [x, w]; lib_fn = lambda: F.conv2d(x, w, padding=pad)
    ref = lib_fn().double()
    row = [name, graph_us(lib_fn)]
    errs = []
    for variant in ("new", "old"):
        out = torch.empty(oshape, device="cuda")
        f = getattr(lib, f"{name}_{variant}")
        ptrs = [ctypes.c_void_p(t.data_ptr()) for t in (*ins, out)]
        run = lambda: f(*ptrs, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        run(); torch.cuda.synchronize()
        errs.append(((out.double() - ref).abs().max() / ref.abs().max()).item())
        t = graph_us(run)
        row += [t, t / row[1]]
    print(f"{row[0]:28} {row[1]:10.2f} {row[2]:9.2f} {row[3]:8.2f} {row[4]:9.2f} {row[5]:8.2f} {errs[0]:8.1e} {errs[1]:8.1e}")
