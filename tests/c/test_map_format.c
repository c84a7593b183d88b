/* qemu-img map output formats, byte for byte. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "imgcopy.h"

static int failures;

static void expect(const char *what, char *got, const char *want)
{
    if (!got || strcmp(got, want) != 0) {
        fprintf(stderr, "%s:\n got: %s\nwant: %s\n", what, got ? got : "(null)", want);
        failures++;
    }
    free(got);
}

#define RAW_DATA (IC_EXT_DATA | IC_EXT_PRESENT | IC_EXT_OFFSET_VALID)
#define RAW_HOLE (IC_EXT_ZERO | IC_EXT_PRESENT | IC_EXT_OFFSET_VALID)

int main(void)
{
    struct ic_error err = {0};
    expect("empty", ic_format_map_json(NULL, 0, 7, 0, &err),
           "[{ \"start\": 7, \"length\": 0, \"depth\": 0, \"present\": false, \"zero\": false, "
           "\"data\": false}]\n");

    struct ic_extent e[3] = {
        {.start = 0, .length = 4096, .host_offset = 0, .flags = RAW_DATA},
        {.start = 4096, .length = 4096, .host_offset = 4096, .flags = RAW_DATA},
        {.start = 8192, .length = 1000, .host_offset = 8192, .flags = RAW_HOLE},
    };
    expect("merge and tail", ic_format_map_json(e, 3, 0, 9728, &err),
           "[{ \"start\": 0, \"length\": 8192, \"depth\": 0, \"present\": true, \"zero\": false, "
           "\"data\": true, \"offset\": 0},\n"
           "{ \"start\": 8192, \"length\": 1536, \"depth\": 0, \"present\": true, \"zero\": true, "
           "\"data\": false, \"offset\": 8192}]\n");
    const char *names[] = {"f.raw"};
    expect("human", ic_format_map_human(e, 3, 0, 9728, names, 1, &err),
           "Offset          Length          Mapped to       File\n"
           "0               0x2000          0               f.raw\n");

    struct ic_extent unmapped = {.start = 0, .length = 512, .flags = IC_EXT_ZERO};
    expect("no offset", ic_format_map_json(&unmapped, 1, 0, 0, &err),
           "[{ \"start\": 0, \"length\": 512, \"depth\": 0, \"present\": false, \"zero\": true, "
           "\"data\": false}]\n");
    if (failures)
        return 1;
    printf("test_map_format: all passed\n");
    return 0;
}
