"""Code several collector plugins share that is not a format: windowed counter rates (``counter_window``),
the node's GPUs as /dev and /sys show them (``gpu_inventory``), loading NVML (``nvml_lib``)."""
