"""Where op configs come from: op-config files, ONNX models, AutoTVM logs."""
