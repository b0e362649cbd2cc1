"""The region's datastores mounted on this node (R-RES-2): one port (`port.Mounter`), its two
adapters (`kernel`: NFS and SMB mounts; `bind`: a local directory bind-mounted in its place,
where a real mount cannot run), and the keeper that holds, probes and heals the mounts."""
