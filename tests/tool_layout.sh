#!/usr/bin/env bash
# `flashlab layout` prints the emulator's fragment maps and swizzles (emulator/fragments.hpp, gmma.hpp; those
# are checked against CuTe by fragments_vs_cute). Here: that the tool renders them where the PTX ISA says, and
# refuses a bad name with exit 2. Usage: tool_layout.sh FLASHLAB_BINARY
set -euo pipefail
tool=$1
fail() { echo "layout: $*" >&2; exit 1; }

# mma.sync m16n8k16's C: row g = lane / 4 holds lanes 4g .. 4g+3, columns 2 (lane % 4) + register.
out=$("$tool" layout mma16816)
grep -qE '^ +0 +0:c0 +0:c1 +1:c0 +1:c1 +2:c0 +2:c1 +3:c0 +3:c1$' <<<"$out" || fail "C row 0 is not lanes 0-3"
grep -qE '^ +9 +4:c2 +4:c3 +5:c2 +5:c3 +6:c2 +6:c3 +7:c2 +7:c3$' <<<"$out" || fail "C row 9 is not lanes 4-7, c2/c3"

# The 128-byte swizzle: chunk 0 of rows 0-7 is stored in chunks 0-7 (the XOR with the row), 8 bank groups.
out=$("$tool" layout swizzle --bytes 128)
for row in 0 1 2 3 4 5 6 7; do
  grep -qE "^ +$row +c$row b$((4 * row))-$((4 * row + 3)) " <<<"$out" || fail "128B swizzle row $row, chunk 0"
done

# ldmatrix without and with .trans: lane 5 receives row 1, columns 2-3; with .trans column 1, rows 2-3.
out=$("$tool" layout ldmatrix)
grep -qE '^ +1 +4l +4h +5l +5h ' <<<"$out" || fail "ldmatrix row 1"
out=$("$tool" layout ldmatrix --trans)
grep -qE '^ +2 +1l +5l +9l +13l ' <<<"$out" || fail "ldmatrix.trans row 2"

# wgmma: the accumulator's last row belongs to warp 3 (threads 124-127); the SVG holds every grid.
svg="$(mktemp --suffix=.svg)"
trap 'rm -f "$svg"' EXIT
"$tool" layout wgmma --n 8 --svg "$svg" >/dev/null
grep -qF '127:3' "$svg" || fail "the SVG has no cell for thread 127, register 3"
grep -qF 'e4m3' "$svg" || fail "the SVG has no e4m3 A fragment"

set +e
"$tool" layout nonsense 2>/dev/null
[[ $? -eq 2 ]] || fail "an unknown layout does not exit 2"
"$tool" layout wgmma --n 12 2>/dev/null
[[ $? -eq 2 ]] || fail "--n 12 does not exit 2"
