/* bench_seed.h - `pxq bench --preset NAME` (bench_seed.c). */
#ifndef PXQ_CLI_BENCH_SEED_H
#define PXQ_CLI_BENCH_SEED_H

/* pxq bench's argv with --preset NAME somewhere in it: runs the preset's rows as pxq bench processes
 * (the other arguments passed on to each, after the preset's own) and prints their table; --dry-run
 * prints the commands instead. NAME: seed (the claim's four rows, bench_seed.c). Returns the exit
 * status: 0, 1 if a row failed, 2 for an unknown preset. */
int bench_preset(int argc, char **argv);

#endif
