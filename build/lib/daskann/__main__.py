from daskann.cli import main

main(prog_name="daskann")
