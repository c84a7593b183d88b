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
