from localspec.frontends.cli import main

main()
