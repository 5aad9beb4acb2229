"""Activities: all the I/O the job workflow needs (store writes, launching processes)."""
