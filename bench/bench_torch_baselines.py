"""What a user runs instead, timed on the GPU: PyTorch's CUDA graph of ResNet-18, ResNet-50 and MobileNetV2
(torchvision, BN folded) and of two and of twelve BERT-base encoder layers (torch.nn.TransformerEncoderLayer, seq 128),
batch 1, in each precision a user runs:

- fp16 (the model and its input made half);
- fp32 as shipped (PyTorch's defaults: cuDNN convolutions in TF32, matmuls in fp32);
- fp32 with TF32 off.

    python3 bench/bench_torch_baselines.py --out DIR [--nets resnet50 bert12 ...]

Each figure is the median of 1000 replays of the captured graph, each between its own CUDA events (bench_network's
cuda_event_median): the GPU's work for one batch, no Python. Prints a table, writes DIR/torch-baselines.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

PRECISIONS = ("fp16", "fp32 as shipped (TF32 convs)", "fp32, TF32 off")


def bert_layers(torch, layers: int = 2):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=768, nhead=12, dim_feedforward=3072, activation="gelu",
                                             batch_first=True, dropout=0.0)
    return torch.nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False).eval()


def torchvision_mobilenet_v2(torch):  # type: ignore[no-untyped-def]
    """torchvision's MobileNetV2 (width 1.0), seeded random weights, eval mode, each BatchNorm folded into the conv
    before it (tests/zoo.py's mobilenet_v2(max_repeats=4) is the same network as NNFusion imports it)."""
    import torchvision
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v2(weights=None).eval()
    for m in model.modules():  # random init leaves BN's running stats at 0/1: folding would be the identity
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    for seq in [m for m in model.modules() if isinstance(m, torch.nn.Sequential)]:
        for i in range(len(seq) - 1):
            if isinstance(seq[i], torch.nn.Conv2d) and isinstance(seq[i + 1], torch.nn.BatchNorm2d):
                seq[i], seq[i + 1] = fuse_conv_bn_eval(seq[i], seq[i + 1]), torch.nn.Identity()
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules()), "a BatchNorm was not folded"
    return model


def main() -> None:
    import torch
    from bench_network import cuda_event_median, pytorch_step, torchvision_resnet

    ap = argparse.ArgumentParser()
    nets = {"resnet18": (lambda: torchvision_resnet("resnet18"), (1, 3, 224, 224)),
            "resnet50": (lambda: torchvision_resnet("resnet50"), (1, 3, 224, 224)),
            "mobilenet_v2": (lambda: torchvision_mobilenet_v2(torch), (1, 3, 224, 224)),
            "bert2": (lambda: bert_layers(torch), (1, 128, 768)),
            "bert12": (lambda: bert_layers(torch, 12), (1, 128, 768))}
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--nets", nargs="+", choices=list(nets), default=list(nets))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for net in args.nets:
        make, shape = nets[net]
        for precision in PRECISIONS:
            half = precision == "fp16"
            model = make().cuda()  # (bench_network's set-up turns TF32 off: the precision is set after it)
            torch.backends.cudnn.allow_tf32 = precision.startswith("fp32 as shipped")
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.benchmark = True
            x = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).cuda()
            if half:
                model, x = model.half(), x.half()
            with torch.no_grad():
                step = pytorch_step(torch, model, x, "graph")
                timing = cuda_event_median(torch, step)
            results.append({"network": net, "precision": precision, **timing,
                            "device": torch.cuda.get_device_name(0), "torch": torch.__version__})
            print(f"{net:12} {precision:30} {timing['median_ms']:.4f} ms (p10 {timing['p10_ms']:.4f}, "
                  f"p90 {timing['p90_ms']:.4f})", flush=True)
    (args.out / "torch-baselines.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
