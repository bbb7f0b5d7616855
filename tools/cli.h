/* cli.h - the commands of the `nibble` tool, one file each group:
 *   nibble.c  main, version, info, demo
 *   ckpt.c    inspect, quantize, convert (builds with the checkpoint API,
 *             NB_HAVE_IO: libnibble has it when cJSON was found)
 *   bench.c, tune.c  bench and tune (CUDA builds; benchlib.c what they share)
 *   args.c    the argument parser they all use (args.h)
 * Each command takes (argc, argv) with argv[0] the command's name and
 * returns the exit code: 0 success, 1 usage error, 2 a check failed (wrong
 * numbers), 3 a library, CUDA or file call failed; its --help lists them. */
#ifndef NB_TOOLS_CLI_H
#define NB_TOOLS_CLI_H

int nb_cli_bench(int argc, char **argv);
int nb_cli_tune(int argc, char **argv);
int nb_cli_inspect(int argc, char **argv);
int nb_cli_quantize(int argc, char **argv);
int nb_cli_convert(int argc, char **argv);

/* Monotonic seconds (nibble.c). */
double nb_cli_now(void);

#endif
