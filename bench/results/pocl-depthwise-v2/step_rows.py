# mobilenet_v2's step with the CPU plane kernels switched off (v18's row kernels on every plane), clnet only
import sys
from clnet import depthwise, cli
depthwise.planes_tile = lambda dev, s, which: None
sys.argv = ["clnet"] + sys.argv[1:]
cli.main()
