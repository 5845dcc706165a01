# xform.py - prints a .cu file with kernel<<<grid, block, smem, stream>>>(args) launches rewritten as
# emu_launch(kernel, dim3(grid), dim3(block), smem, args) for tools/cuda_emu (see run.sh), and
# cudaLaunchKernelEx as emu_launch_ex. With --shared also: shared-memory declarations as each block's
# own memory (emu_dshared, emu_sshared), the sm_90-only bodies compiled in, cooperative_groups'
# clusters as emu_cg's.   usage: xform.py FILE.cu [--shared]
import re, sys
s = open(sys.argv[1]).read()
def split_top(a):
    out, depth, cur = [], 0, ''
    for i, ch in enumerate(a):
        if ch in '(<': depth += 1
        if ch in ')>' and not (ch == '>' and i > 0 and a[i - 1] == '-'): depth -= 1  # not kv->x
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
s = s.replace('cudaLaunchKernelEx(', 'emu_launch_ex(')
if '--shared' in sys.argv[2:]:  # each block's own shared memory, the sm_90 bodies (clusters) compiled in
    s = re.sub(r'extern __shared__ (\w+) (\w+)\[\];', r'\1 *\2 = (\1 *)emu_dshared();', s)
    s = re.sub(r'__shared__ (\w+) (\w+)\[(\w+)\];', r'\1 *\2 = (\1 *)emu_sshared(__COUNTER__, sizeof(\1) * (\3));', s)
    s = re.sub(r'__shared__ (\w+) (\w+);', r'\1 &\2 = *(\1 *)emu_sshared(__COUNTER__, sizeof(\1));', s)
    s = s.replace('#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900', '#if 1')
    s = s.replace('namespace cg = cooperative_groups;', 'namespace cg = emu_cg;')
print('#include "emu.h"')
print(s)
