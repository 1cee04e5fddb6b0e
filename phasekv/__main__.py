"""`python -m phasekv ...` (and `torchrun -m phasekv train ...`) run the phasekv command line."""

from phasekv.cli import main

main()
