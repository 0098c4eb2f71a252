"""How a packed weight is stored: the panel layout the kernels read (``panels``) and the
saved format of files and pickles (``saved``). The API, ``PackedWeight`` and the packing
functions, is ``pyw8a8.packing``."""
