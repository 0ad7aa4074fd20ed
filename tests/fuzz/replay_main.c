/*
 * replay_main.c: a main() for the fuzz harnesses in the normal build. Each
 * argument is a file or a folder of files; every file is passed once to
 * LLVMFuzzerTestOneInput. This is how the seed corpus and the reproducers of
 * crashes found by fuzzing (tests/fuzz/regressions/) run as CTest tests
 * under the ordinary and the sanitizer builds, without clang or libFuzzer.
 * Exits 0 when every file ran (a crash aborts), 1 when a file is unreadable
 * or no file was found.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf = NULL;
    long n;
    int rc = -1;

    if (f == NULL)
        goto out;
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0)
        goto out_close;
    /* A copy of exactly n bytes, so ASan catches reads past the input. */
    if ((buf = malloc(n ? (size_t)n : 1)) == NULL ||
        (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n))
        goto out_close;
    LLVMFuzzerTestOneInput(buf, (size_t)n);
    rc = 0;
out_close:
    free(buf);
    fclose(f);
out:
    if (rc < 0)
        fprintf(stderr, "replay: cannot read %s\n", path);
    return rc;
}

static int run_path(const char *path, size_t *count)
{
    struct stat st;
    DIR *d;
    struct dirent *e;
    int rc = 0;

    if (stat(path, &st) != 0) {
        fprintf(stderr, "replay: %s: not found\n", path);
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        (*count)++;
        return run_file(path);
    }
    if ((d = opendir(path)) == NULL)
        return -1;
    while ((e = readdir(d)) != NULL) {
        char sub[4096];
        if (e->d_name[0] == '.')
            continue;
        snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
        if (stat(sub, &st) == 0 && S_ISREG(st.st_mode)) {
            (*count)++;
            if (run_file(sub) < 0)
                rc = -1;
        }
    }
    closedir(d);
    return rc;
}

int main(int argc, char **argv)
{
    size_t count = 0;
    int rc = 0;

    for (int i = 1; i < argc; i++)
        if (run_path(argv[i], &count) < 0)
            rc = 1;
    printf("replayed %zu inputs\n", count);
    return rc != 0 || count == 0 ? 1 : 0;
}
