#!/usr/bin/env bash
# mtp_train_gpu.sh - one GPU run that trains the demo model's MTP block
# (tools/train_demo/train_mtp.py) and writes its GGUF, training log and the
# PyTorch reference fixture under $OUT. Needs torch on the machine and the
# training data made here (ignored files, carried):
#   python3 tools/train_demo/mtp_texts.py .devwork/mtp_texts.txt
#   ./ds4-mtp-data -m models/ds4-demo.gguf --texts .devwork/mtp_texts.txt --out .devwork/mtp
#   (first 100k tokens kept as .devwork/mtp100k.tokens / .hidden)
set -u
OUT=${OUT:-mtp-out}
mkdir -p "$OUT"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" 2>&1 | tee "$OUT/train.log"
timeout 280 python3 tools/train_demo/train_mtp.py --model models/ds4-demo.gguf --data .devwork/mtp100k \
    --out "$OUT/ds4-demo-mtp.gguf" --fixture "$OUT/mtp" --steps 4000 --batch 32 --time-limit 200 \
    --device cuda >> "$OUT/train.log" 2>&1
echo "rc=$?" >> "$OUT/train.log"
tail -8 "$OUT/train.log"
ls -la "$OUT" "$OUT/mtp" 2>/dev/null
