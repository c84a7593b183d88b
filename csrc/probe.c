/* Recognising image formats by their magic: the readable ones, and the
 * ones imgcopy cannot read yet, so that an image is never read as raw
 * bytes by mistake (a VHD's footer or a VMDK's grain tables are not guest
 * data).  Rules follow each format's specification and what qemu's probes
 * accept; a raw disk's first sector (an MBR, a GPT, a file system) matches
 * none of them. */
#include <stdint.h>
#include <string.h>

#include "probe.h"

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[3] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0];
}

static int starts(const uint8_t *buf, size_t len, const char *magic, size_t mlen)
{
    return len >= mlen && memcmp(buf, magic, mlen) == 0;
}

#define STARTS(buf, len, lit) starts(buf, len, lit, sizeof lit - 1)

/* A VHD footer ("conectix", big-endian fields, a one's complement
 * checksum of its bytes with the checksum field as zero). */
static int vhd_footer(const uint8_t *f, size_t len)
{
    if (len < 512 || !STARTS(f, len, "conectix"))
        return 0;
    uint32_t sum = 0;
    for (size_t i = 0; i < 512; i++)
        if (i < 64 || i >= 68)
            sum += f[i];
    return ~sum == be32(f + 64);
}

/* A VMDK descriptor file: "# Disk DescriptorFile" first (what VMware and
 * qemu write), or, as qemu also accepts, comment and blank lines and then
 * "version=1".."version=3" on a line of its own. */
static int vmdk_descriptor(const uint8_t *head, size_t len)
{
    if (STARTS(head, len, "# Disk DescriptorFile"))
        return 1;
    size_t i = 0;
    for (;;) {
        while (i < len && (head[i] == ' ' || head[i] == '\t' || head[i] == '\r' ||
                           head[i] == '\n'))
            i++;
        if (i >= len || head[i] != '#')
            break;
        while (i < len && head[i] != '\n')
            i++;
    }
    if (i + 9 > len || memcmp(head + i, "version=", 8) != 0 || head[i + 8] < '1' ||
        head[i + 8] > '3')
        return 0;
    i += 9;
    if (i < len && head[i] == '\r')
        i++;
    return i < len && head[i] == '\n';
}

/* cloop: a shell preamble whose second line names the format version
 * ("#V2.0 Format", "#V4.0 Format ..."). */
static int cloop_preamble(const uint8_t *head, size_t len)
{
    if (!STARTS(head, len, "#!/bin/sh\n#V"))
        return 0;
    const uint8_t *line = head + 11, *end = memchr(line, '\n', len - 11);
    if (!end)
        return 0;
    for (const uint8_t *p = line; p + 7 <= end; p++)
        if (memcmp(p, " Format", 7) == 0)
            return 1;
    return 0;
}

/* An octal number field of a tar header: digits, padded with spaces or
 * NULs (GNU's base-256 too, first byte 0x80). */
static int tar_number(const uint8_t *f, size_t n, uint64_t *out)
{
    uint64_t v = 0;
    size_t i = 0, digits = 0;
    if (f[0] == 0x80) {
        *out = 0;
        return 1;
    }
    while (i < n && f[i] == ' ')
        i++;
    for (; i < n && f[i] >= '0' && f[i] <= '7'; i++, digits++)
        v = v << 3 | (uint64_t)(f[i] - '0');
    for (; i < n; i++)
        if (f[i] != ' ' && f[i] != '\0')
            return 0;
    *out = v;
    return digits > 0;
}

const char *ic_probe_container(const uint8_t *head, size_t hlen)
{
    return ic_probe_is_tar(head, hlen) ? "tar" : NULL;
}

int ic_probe_is_tar(const uint8_t *head, size_t hlen)
{
    if (hlen < 512)
        return 0;
    uint64_t stored, size, mode;
    if (!tar_number(head + 148, 8, &stored) || !tar_number(head + 124, 12, &size))
        return 0;
    /* the checksum as GNU tar takes it: unsigned, or (old tars) signed bytes */
    int64_t usum = 0, ssum = 0;
    for (size_t i = 0; i < 512; i++) {
        uint8_t c = (i >= 148 && i < 156) ? ' ' : head[i];
        usum += c;
        ssum += (int8_t)c;
    }
    if ((int64_t)stored != usum && (int64_t)stored != ssum)
        return 0;
    if (memcmp(head + 257, "ustar", 5) == 0)
        return 1;
    /* v7: no magic; a name, a mode, a known type */
    uint8_t type = head[156];
    return head[0] != '\0' && tar_number(head + 100, 8, &mode) &&
           (type == '\0' || (type >= '0' && type <= '7'));
}

const char *ic_probe_format(const uint8_t *head, size_t hlen, const uint8_t *tail, size_t tlen)
{
    if (STARTS(head, hlen, "QFI\xfb") && hlen >= 8)
        return be32(head + 4) == 1 ? "qcow" : "qcow2";
    if (STARTS(head, hlen, "QED\0"))
        return "qed";
    if (STARTS(head, hlen, "KDMV") || STARTS(head, hlen, "COWD") || vmdk_descriptor(head, hlen))
        return "vmdk";
    if (STARTS(head, hlen, "vhdxfile"))
        return "vhdx";
    if (STARTS(head, hlen, "conectix"))
        return "vpc";
    if (hlen >= 0x44 && le32(head + 0x40) == 0xbeda107fu)
        return "vdi";
    if (STARTS(head, hlen, "WithoutFreeSpace") || STARTS(head, hlen, "WithouFreSpacExt"))
        return "parallels";
    if (starts(head, hlen, "Bochs Virtual HD Image", sizeof "Bochs Virtual HD Image"))
        return "bochs";
    if (cloop_preamble(head, hlen))
        return "cloop";
    if (STARTS(head, hlen, "LUKS\xba\xbe"))
        return "luks";
    /* an archive (an OVA) is not a disk, though its members may be */
    if (ic_probe_is_tar(head, hlen))
        return "tar";
    /* formats whose only mark is a trailer in the last sector: a fixed
     * VHD's footer, a DMG's "koly" block (version 4, 512 bytes) */
    if (tlen >= 512) {
        const uint8_t *t = tail + tlen - 512;
        if (vhd_footer(t, 512))
            return "vpc";
        if (STARTS(t, 512, "koly") && be32(t + 4) == 4 && be32(t + 8) == 512)
            return "dmg";
    }
    return "raw";
}
