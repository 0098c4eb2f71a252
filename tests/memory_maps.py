"""What the kernel says of this process's memory: /proc/self/smaps, read by address."""


def smaps_field(address, field):
    """`field` of /proc/self/smaps for the mapping holding `address` (its words after the
    name, e.g. "rd wr mr mw me ac hg" for VmFlags), or None where absent."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == field + ":":
                return " ".join(line.split()[1:])
    return None
