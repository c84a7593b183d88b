/* Files an image names, opened beneath its directory (csrc/drivers/file.c):
 * openat2's RESOLVE_BENEATH and the walk used without openat2, on one tree
 * of files, directories and links leading in and out. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "drivers/file.h"

static char top[] = "/tmp/imgcopy-test-beneath-XXXXXX";

static void make(const char *rel, const char *text)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", top, rel);
    FILE *f = fopen(p, "w");
    CHECK(f != NULL, "create %s: %s", p, strerror(errno));
    fputs(text, f);
    CHECK(fclose(f) == 0, "close %s", p);
}

static void dir(const char *rel)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", top, rel);
    CHECK(mkdir(p, 0700) == 0, "mkdir %s: %s", p, strerror(errno));
}

static void link_(const char *target, const char *rel)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", top, rel);
    CHECK(symlink(target, p) == 0, "symlink %s: %s", p, strerror(errno));
}

/* What opening `name` beneath d/ gives: the file's first byte, or -errno. */
static int open_in(int dfd, const char *name, int use_openat2)
{
    int fd = ic_open_beneath(dfd, name, O_RDONLY | O_CLOEXEC | O_NONBLOCK, use_openat2);
    if (fd < 0)
        return fd;
    char c = 0;
    ssize_t n = read(fd, &c, 1);
    close(fd);
    return n == 1 ? c : -EIO;
}

int main(void)
{
    CHECK(mkdtemp(top) != NULL, "mkdtemp: %s", strerror(errno));
    dir("d");
    dir("d/sub");
    make("secret", "S");
    make("d/a", "A");
    make("d/sub/b", "B");
    link_("a", "d/in");             /* a link inside, to a file inside */
    link_("sub", "d/insub");        /* to a directory inside */
    link_("../a", "d/sub/upa");     /* up, but still inside */
    link_("../secret", "d/out");    /* up and out */
    link_("..", "d/parent");        /* a directory outside */
    link_("/etc/passwd", "d/abs");  /* absolute */
    link_("/dev/zero", "d/dev");    /* a device, absolute */
    link_("/proc/self/fd/0", "d/magic");
    link_("loop", "d/loop");

    char dpath[256];
    snprintf(dpath, sizeof dpath, "%s/d", top);
    int dfd = open(dpath, O_PATH | O_DIRECTORY | O_CLOEXEC);
    CHECK(dfd >= 0, "open %s: %s", dpath, strerror(errno));

    /* both ways alike: files inside, and every way out refused */
    for (int way = 0; way < 2; way++) {
        CHECK(open_in(dfd, "a", way) == 'A', "a (openat2 %d)", way);
        CHECK(open_in(dfd, "./a", way) == 'A', "./a (openat2 %d)", way);
        CHECK(open_in(dfd, "sub//b", way) == 'B', "sub//b (openat2 %d)", way);
        CHECK(open_in(dfd, "nothing", way) == -ENOENT, "missing (openat2 %d)", way);
        CHECK(open_in(dfd, "a/x", way) == -ENOTDIR, "a/x (openat2 %d)", way);
        CHECK(open_in(dfd, "/etc/passwd", way) == -EXDEV, "absolute (openat2 %d)", way);
        CHECK(open_in(dfd, "../secret", way) == -EXDEV, "../secret (openat2 %d)", way);
        CHECK(open_in(dfd, "sub/../../secret", way) == -EXDEV, "sub/../.. (openat2 %d)", way);
        int e = way ? -EXDEV : -ELOOP; /* the walk follows no link at all */
        CHECK(open_in(dfd, "out", way) == e, "out (openat2 %d): %d", way, open_in(dfd, "out", way));
        CHECK(open_in(dfd, "parent/secret", way) == e, "parent/secret (openat2 %d)", way);
        CHECK(open_in(dfd, "abs", way) == e, "abs (openat2 %d)", way);
        CHECK(open_in(dfd, "dev", way) == e, "dev (openat2 %d)", way);
        CHECK(open_in(dfd, "magic", way) == e || open_in(dfd, "magic", way) == -ELOOP,
              "magic (openat2 %d)", way);
        CHECK(open_in(dfd, "loop", way) == -ELOOP, "loop (openat2 %d)", way);
    }
    /* links that stay inside: openat2 follows them, the walk refuses them */
    CHECK(open_in(dfd, "in", 1) == 'A', "in");
    CHECK(open_in(dfd, "insub/b", 1) == 'B', "insub/b");
    CHECK(open_in(dfd, "sub/upa", 1) == 'A', "sub/upa");
    CHECK(open_in(dfd, "sub/../a", 1) == 'A', "sub/../a");
    CHECK(open_in(dfd, "in", 0) == -ELOOP, "in (walk)");
    CHECK(open_in(dfd, "insub/b", 0) == -ELOOP, "insub/b (walk)");
    CHECK(open_in(dfd, "sub/../a", 0) == -EXDEV, "sub/../a (walk: never up)");
    close(dfd);

    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", top);
    CHECK(system(cmd) == 0, "rm");
    printf("test_open_beneath: %lu checks passed\n", check_count);
    return 0;
}
