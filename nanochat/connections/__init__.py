"""The stream connections: everything between the normed embedding and the final norm.

Where each part lives:

    registry.py     the wirings (VARIANTS, found by `discover`), the queries the project asks
                    (`spec`, `specs`, `label`, ...) and a config's resolution into a built
                    frame (`resolve_config`, `build`)
    streams.py      `StreamConnections`, the frame the model runs: expand, the layers, reduce
    frame.py        the layer protocol (`ConnectionLayer`, `BlockLevelLayer`) and the frame's
                    expand and reduce (the HC options)
    hc_layer.py     the HC family's layer (`HyperConnection`) and what its wirings share
    spec.py         what a wiring's SPEC declares, checked
    backends/       the code that runs the stream work (--hc-kernels)
    <wiring>.py     one module per wiring (hc.py, kromhc.py, attnres.py, ...), each registered
                    under its file name because it declares SPEC

This module is the one place a wiring imports from, in the package or outside it
(docs/connections.md, "Adding a wiring"):

    from nanochat.connections import ConnectionLayer, coefficient_dtype, no_autocast, resolve_one_state

It names the layer bases, the one-state check and the HC family's pieces, the helpers a step
needs (the dtype of coefficients, autocast off, the stream mixes), the diagnostics a layer
records and the parameter counts a SPEC gives, and then the registry's names. The registry is
imported last: it imports the wirings, which import the names above from this module while
it is still being imported.
"""

# What a wiring imports. The layer bases and the one-state check:
from nanochat.connections.frame import BlockLevelLayer, ConnectionLayer, Parameterless, resolve_one_state
# the HC family's layer and what its wirings share:
from nanochat.connections.hc_layer import (FAMILY_SPEC, LAYER_SPEC, OFF_IDENTITY_BIAS, HyperConnection,
                                           column_stochastic_dead, doubly_stochastic_dead, layer_options,
                                           resolve_streams)
# the helpers a step needs: the coefficients' dtype, autocast off, the stream mixes:
from nanochat.connections.backends.ops import RMS_EPS, coefficient_dtype, mix_post, mix_pre, no_autocast, stream_sum
# what a layer records for the diagnostics, and the parameter counts a SPEC gives:
from nanochat.connections.diagnostics import config_params, option_params, record_layer, record_reads
from nanochat.connections.spec import SpecError

# What the project asks: the frame and the registry (imported last: see above).
from nanochat.connections.streams import StreamConnections
from nanochat.connections.registry import (EXTERNAL, HC_OPTIONS, VARIANTS, build, check_layers, discover,
                                           external_wirings, hyper_connection_layers, in_package, label,
                                           other_fields, own_settings, pretraining_warning, resolve_backend,
                                           resolve_config, resolve_fields, resolve_options, runs_on, seed_free_init,
                                           sits_at_init, spec, specs, takes_option, variant_fields, wiring_file)
