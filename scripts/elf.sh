# Sourced by scripts/images.sh, scripts/arm64.sh and scripts/release.sh: what an ELF file is
# built for, as readelf names it.
#   elf_machine FILE     its Machine (empty when FILE is no ELF file)
#   elf_machine_of ARCH  the Machine a Debian architecture's binaries have (amd64, arm64)
elf_machine() { readelf -h "$1" 2>/dev/null | awk -F: '/Machine:/ {gsub(/^ +/, "", $2); print $2}'; }
elf_machine_of() {
  case "$1" in
    amd64) echo "Advanced Micro Devices X86-64" ;;
    arm64) echo AArch64 ;;
    *) echo "elf: no machine known for $1" >&2; return 1 ;;
  esac
}
