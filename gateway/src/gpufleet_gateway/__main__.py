from gpufleet_gateway.app import main

main()
