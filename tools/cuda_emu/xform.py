# xform.py - prints a .cu file with kernel<<<grid, block, smem, stream>>>(args) launches rewritten as
# emu_launch(kernel, dim3(grid), dim3(block), smem, args) for tools/cuda_emu (see run.sh).
import re, sys
s = open(sys.argv[1]).read()
def split_top(a):
    out, depth, cur = [], 0, ''
    for ch in a:
        if ch in '(<': depth += 1
        if ch in ')>': depth -= 1
        if ch == ',' and depth == 0: out.append(cur); cur = ''
        else: cur += ch
    out.append(cur); return [x.strip() for x in out]
def rep(m):
    k, cfg, args = m.group(1), m.group(2), m.group(3)
    c = split_top(cfg)
    grid, block = c[0], c[1]
    smem = c[2] if len(c) > 2 else '0'
    return 'emu_launch(%s, dim3(%s), dim3(%s), (size_t)(%s), %s);' % (k, grid, block, smem, args)
s = re.sub(r'([A-Za-z_]\w*(?:<[^<>;]*>)?)<<<(.*?)>>>\((.*?)\);', rep, s, flags=re.S)
print('#include "emu.h"')
print(s)
