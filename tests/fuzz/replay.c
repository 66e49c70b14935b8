/* replay.c — runs a fuzz target's LLVMFuzzerTestOneInput over files, without libFuzzer:
 * what `make test` (tests/test_fuzz_corpus.py) does with the regression corpus, with gcc
 * and with or without the sanitizers. Arguments: files or directories (one level). Prints
 * how many inputs ran; exits 0 unless an input could not be read (a crash is a signal). */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv);

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "replay: cannot open '%s'\n", path); return -1; }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "replay: cannot read '%s'\n", path);
        fclose(f);
        free(buf);
        return -1;
    }
    fclose(f);
    if (getenv("REPLAY_VERBOSE")) fprintf(stderr, "replay: %s\n", path);
    LLVMFuzzerTestOneInput(buf, (size_t)n);
    free(buf);
    return 1;
}

int main(int argc, char **argv) {
    if (LLVMFuzzerInitialize && LLVMFuzzerInitialize(&argc, &argv)) return 1;
    long ran = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) { fprintf(stderr, "replay: no such file '%s'\n", argv[i]); return 1; }
        if (!S_ISDIR(st.st_mode)) {
            if (run_file(argv[i]) < 0) return 1;
            ran++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        struct dirent *de;
        char path[4096];
        while (d && (de = readdir(d))) {
            if (de->d_name[0] == '.') continue;
            snprintf(path, sizeof path, "%s/%s", argv[i], de->d_name);
            if (run_file(path) < 0) { closedir(d); return 1; }
            ran++;
        }
        if (d) closedir(d);
    }
    printf("replay: %ld inputs ran\n", ran);
    return 0;
}
