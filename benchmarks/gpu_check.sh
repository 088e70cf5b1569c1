#!/usr/bin/env bash
# The GPU measurements of the throughput issue (#12), as one prepared script for a machine with a CUDA
# GPU (the development machine has none). Writes JSON under ${OUT:-gpu-results}/ and prints the tables.
#   bash benchmarks/gpu_check.sh          # about 5 minutes on one GPU once the corpora are cached
set -euo pipefail
out="${OUT:-gpu-results}"
mkdir -p "$out"
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU here'; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))" | tee "$out/device.txt"
gates data fetch libreoffice-help:zh-en >/dev/null
# the code here on the GPU against the baseline commit on the CPU (it predates devices)
python benchmarks/training_throughput.py --device cuda --threads "$(nproc)" --json "$out/training_throughput.json"
python benchmarks/translator_scaling.py --device cuda --json "$out/translator_scaling.json"
# determinism on CUDA: one short translator run twice must give identical metrics
python - <<'PY' | tee "$out/determinism.txt"
from gates.study import Budget, NullReporter
from gates.models.treeheap_translator import TranslatorConfig, TranslatorStudy
config = TranslatorConfig(arm="lifting", device="cuda", bleu_examples=20, test_examples=200)
runs = [TranslatorStudy().run(config, 0, NullReporter(Budget(steps=20, eval_every=10))) for _ in range(2)]
same = {k: runs[0][k] == runs[1][k] for k in runs[0] if k not in TranslatorStudy.machine_metrics}
print("identical on CUDA:", all(same.values()), {k: v for k, v in same.items() if not v})
PY
