#!/usr/bin/env bash
# `flashlab compare` and `flashlab roofline` with no arguments (the ladder's default views, tools/ladder.hpp):
# every available implementation gets a checked result row in compare, which exits 0, and the roofline places
# both a prefill and a decode point; emulated rows' times are marked as the emulator's. Usage: tool_ladder_views.sh FLASHLAB_BINARY
set -euo pipefail
tool=$1
compare=$("$tool" compare --repeat 1)
names=$("$tool" list --json | python3 -c \
  'import json, sys; print("\n".join(i["name"] for i in json.load(sys.stdin) if i["available"]))')
for name in $names; do
  if ! grep -qE "^$name +(cpu|cuda|emu) +[0-9]" <<<"$compare"; then
    echo "compare shows no result row for $name:" >&2
    echo "$compare" >&2
    exit 1
  fi
done
# An emulated row's time is the CPU emulator's: in the forward and the backward tables alike, it carries a `*`,
# no rate, and the legend that says it is not a GPU time.
backward=$("$tool" compare cpu_tiled/backward cuda_v2/split_q --backward --seqlen-q 64 --heads 2 --repeat 1)
for table in "$compare" "$backward"; do
  if ! grep -qE "^cuda_v2/split_q +emu " <<<"$table" ||
    grep -E "^[^ ]+ +emu " <<<"$table" | grep -vqE " [0-9.]+\* +- +- " ||
    ! grep -qF "not a GPU time" <<<"$table"; then
    echo "an emulated row's time is not marked as the emulator's:" >&2
    echo "$table" >&2
    exit 1
  fi
done
"$tool" roofline --repeat 1 --svg ladder_roofline.svg >/dev/null
for point in 'cpu_tiled/forward (prefill f32)' 'decoding/split_kv (decode f32)'; do
  grep -qF "$point" ladder_roofline.svg || { echo "the roofline has no point '$point'" >&2; exit 1; }
done
