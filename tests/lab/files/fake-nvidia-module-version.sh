#!/bin/sh
# LAB FIXTURE (see README, "what is tested where"): no kernel module can load
# in a container, so at every boot a lab node writes the version of the
# nvidia module DKMS built for it, as the kernel would publish it in
# /sys/module/nvidia/version once the module is loaded. The lab inventory
# points nvidia_driver_module_version_file there. A driver upgrade without
# a reboot leaves the old version here (the driver/library mismatch); a
# restart of the node (podman restart) loads the new one.
#
# With --first-install (apt's DPkg::Post-Invoke hook, after every dpkg run)
# it writes the version only while none is published: the reboot a GPU
# server makes after its first driver install (the role reboots a host whose
# driver is installed but not loaded), which a container cannot make. An
# upgrade later leaves the published version alone, as a running kernel does.
set -eu
out=/run/gpufleet-lab/nvidia-module-version
if [ "${1:-}" = --first-install ] && [ -e "$out" ]; then
  exit 0
fi
mkdir -p "${out%/*}"
for module in /lib/modules/*/updates/dkms/nvidia-current.ko* /lib/modules/*/updates/dkms/nvidia.ko*; do
  [ -e "$module" ] || continue
  version=$(modinfo -F version "$module" 2>/dev/null || true)
  if [ -n "$version" ]; then
    echo "$version" > "$out"
    exit 0
  fi
done
[ "${1:-}" = --first-install ] || rm -f "$out"
