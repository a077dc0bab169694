"""python -m faverify: the command line, where the console script is not on PATH."""
from faverify.cli import main

main()
