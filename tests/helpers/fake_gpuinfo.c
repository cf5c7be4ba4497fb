/* fake_gpuinfo: a stand-in for capd-gpuinfo in tests (config key
 * gpuinfo_bin), so the daemon's device handling can be tested on a host
 * without a GPU.
 *
 * It prints the contents of the file named by $FAKE_GPUINFO_FILE, which a
 * test writes (and rewrites before POST /v1/devices/refresh). A file that
 * holds one of these words makes it misbehave instead:
 *
 *   HANG      sleep until killed (gpuinfo_timeout_ms)
 *   EXIT3     print a valid empty answer, exit 3
 *   GARBAGE   print a line that is not JSON, exit 0
 *   FLOOD     print 1 MiB of JSON-looking text (past the output cap)
 *   CRASH     abort()
 *
 * No variable or no file: {"devices":[],"reason":"fake: no device file"}.
 * Every run appends a line to $FAKE_GPUINFO_FILE.runs, so a test can count
 * probes, and the line holds $CUDA_DEVICE_ORDER as the probe saw it.
 * It dies by SIGALRM after 600 s whatever happens, so a broken test cannot
 * leak it.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(void)
{
    alarm(600);
    const char *path = getenv("FAKE_GPUINFO_FILE");
    if (!path) {
        puts("{\"devices\":[],\"reason\":\"fake: no device file\"}");
        return 0;
    }
    char runs[4096];
    snprintf(runs, sizeof runs, "%s.runs", path);
    FILE *r = fopen(runs, "a");
    if (r) {
        const char *order = getenv("CUDA_DEVICE_ORDER");
        fprintf(r, "run CUDA_DEVICE_ORDER=%s\n", order ? order : "");
        fclose(r);
    }
    static char buf[1 << 16];
    size_t n = 0;
    FILE *f = fopen(path, "r");
    if (f) {
        n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
    }
    buf[n] = 0;
    if (!f) {
        puts("{\"devices\":[],\"reason\":\"fake: no device file\"}");
        return 0;
    }
    if (strncmp(buf, "HANG", 4) == 0) {
        for (;;)
            pause();
    }
    if (strncmp(buf, "EXIT3", 5) == 0) {
        puts("{\"devices\":[],\"reason\":null}");
        return 3;
    }
    if (strncmp(buf, "GARBAGE", 7) == 0) {
        puts("this is not JSON");
        return 0;
    }
    if (strncmp(buf, "FLOOD", 5) == 0) {
        fputs("{\"devices\":[],\"reason\":\"", stdout);
        for (int i = 0; i < 1024 * 1024; i++)
            if (putchar('x') == EOF)
                return 1;
        puts("\"}");
        return 0;
    }
    if (strncmp(buf, "CRASH", 5) == 0)
        abort();
    fwrite(buf, 1, n, stdout);
    return 0;
}
