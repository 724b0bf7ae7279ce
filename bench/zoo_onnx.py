"""Write networks of tests/zoo.py as ONNX files, by the short names the device scripts use.

    python3 bench/zoo_onnx.py DIR NAME...     (DIR/NAME.onnx for each NAME; one already there is kept)

One table for bench/device_prep.sh, bench/device_run.sh and bench/h100_tensorcore.sh: the same name is the same
network in each (MobileNetV2 with two repeats a stage is `mnv2`, the full one `mnv2full`)."""
from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import zoo

NETWORKS: dict[str, Callable[[], object]] = {
    "bert2": zoo.bert_encoder, "bert12": lambda: zoo.bert_encoder(layers=12), "gpt": zoo.gpt_decoder,
    "vit": zoo.attention_bmm, "gru": zoo.gru, "dense": zoo.densenet_block, "se": zoo.se_block, "tcn": zoo.tcn,
    "mnv2": zoo.mobilenet_v2, "mnv2full": lambda: zoo.mobilenet_v2(max_repeats=4),
    "resnet50full": lambda: zoo.resnet50(blocks=(3, 4, 6, 3)), "convnext": zoo.convnext_block,
    "towers": zoo.two_towers, "unetb": lambda: zoo.unet_decoder(bilinear=True), "unet": zoo.unet_decoder,
    "resbn": zoo.resnet_unfolded_bn,
}


def main(argv: list[str]) -> int:
    if len(argv) < 2 or any(name not in NETWORKS for name in argv[1:]):
        print(f"usage: zoo_onnx.py DIR NAME... (names: {' '.join(NETWORKS)})", file=sys.stderr)
        return 2
    import onnx

    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    for name in argv[1:]:
        path = out / f"{name}.onnx"
        if not path.exists():
            model = NETWORKS[name]()
            model.ir_version = min(model.ir_version, 10)  # ONNX Runtime 1.30 reads up to 10
            onnx.save(model, str(path))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
