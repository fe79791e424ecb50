"""Pure planning on the driver, no I/O: requested bounds -> offset ranges -> Spark tasks.

OffsetRange is also the unit an executor is asked to read.
"""
