#!/bin/sh
# LAB FIXTURE (see README, "what is tested where"): no kernel module can load
# in a container, so at every boot a lab node writes the version of the
# nvidia module DKMS built for it, as the kernel would publish it in
# /sys/module/nvidia/version once the module is loaded. The lab inventory
# points nvidia_driver_module_version_file there. A driver upgrade without
# a reboot leaves the old version here (the driver/library mismatch); a
# restart of the node (podman restart) loads the new one.
set -eu
out=/run/gpufleet-lab/nvidia-module-version
mkdir -p "${out%/*}"
for module in /lib/modules/*/updates/dkms/nvidia-current.ko* /lib/modules/*/updates/dkms/nvidia.ko*; do
  [ -e "$module" ] || continue
  version=$(modinfo -F version "$module" 2>/dev/null || true)
  if [ -n "$version" ]; then
    echo "$version" > "$out"
    exit 0
  fi
done
rm -f "$out"
