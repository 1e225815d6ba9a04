# Read-only probe (tasks/foreign.yml, one remote command): what NVIDIA driver is on the host, whoever installed
# it. Prints sections that plugins/filter/foreign_driver.py parses:
#   [dpkg]     dpkg -l's lines of the packages with nvidia in the name, libcuda*, cuda-drivers*
#   [policy]   apt-cache policy of those on disk (the repositories that offer the installed version)
#   [sources]  apt-cache policy (each repository's Release fields: origin, label, suite)
#   [runfile]  the files NVIDIA's .run installer writes, where they exist
#   [owners]   dpkg -S of those files (a file no package owns is the installer's)
# The .run installer (github.com/NVIDIA/nvidia-installer, 590.48.01): /usr/bin/nvidia-installer and its
# nvidia-uninstall; its log /var/log/nvidia-installer.log (nvidia-installer.h) and backup log /var/lib/nvidia/log
# (backup.c); the libraries in /usr/lib/x86_64-linux-gnu on x86_64 (files.c, native_libdirs), each
# lib<name>.so.<driver version>; the modules in /lib/modules/<kernel>/kernel/drivers/video (option_table.h,
# --kernel-install-path). Only versioned library names are looked at (a driver version has a three-digit
# major): the .so.1 links are ldconfig's or a distribution's alternatives.
set -u
export LC_ALL=C
listing=$(dpkg -l 2>/dev/null | awk '$1 ~ /^[a-z][a-z]/ && $2 ~ /nvidia|^libcuda|^cuda-drivers/')
names=$(printf '%s\n' "$listing" | awk '$1 ~ /^.[iufhwt]/ { print $2 }')
echo '[dpkg]'
[ -z "$listing" ] || printf '%s\n' "$listing"
echo '[policy]'
# shellcheck disable=SC2086 # one word per package name
[ -z "$names" ] || apt-cache policy $names 2>/dev/null
echo '[sources]'
[ -z "$names" ] || apt-cache policy 2>/dev/null
echo '[runfile]'
files=
for f in /usr/bin/nvidia-uninstall /var/lib/nvidia/log /var/log/nvidia-installer.log \
    /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.[0-9][0-9][0-9].* /usr/lib/x86_64-linux-gnu/libcuda.so.[0-9][0-9][0-9].* \
    /lib/modules/*/kernel/drivers/video/nvidia*.ko*; do
  if [ -e "$f" ] || [ -L "$f" ]; then
    echo "$f"
    [ "$f" = /var/log/nvidia-installer.log ] || files="$files $f"
  fi
done
echo '[owners]'
# shellcheck disable=SC2086 # paths without spaces, one word each
[ -z "$files" ] || dpkg -S $files 2>&1
exit 0
