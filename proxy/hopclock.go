package proxy

// hopStage names a stage of a remote exchange, for the hop clock (see
// hopclock_on.go): hopMark(s) ends stage s. Without the orbithopclock build
// tag the marks compile to nothing.
type hopStage uint8

const (
	hopStart      hopStage = iota
	hopCallerPrep          // the caller: a stream, the frame's fields
	hopToOwner             // the caller writes frame and head; the owner wakes and reads the frame
	hopOwnerAdmit          // the owner: deadline, admission, a worker of its governor
	hopOwnerLease          // the owner takes up the lease (the table, the connection's liveness check)
	hopOwnerHead           // the owner parses the request head
	hopOwnerSetup          // the owner prepares the exchange (buffers, body, trace, watch)
	hopUpstream            // the exchange on the owner's connection, up to the response head
	hopRelay               // the owner relays the response onto the stream
	hopToCaller            // the caller wakes and parses the response
	numHopStages
)

var hopStageNames = [numHopStages]string{
	hopCallerPrep: "caller-prep",
	hopToOwner:    "to-owner",
	hopOwnerAdmit: "owner-admit",
	hopOwnerLease: "owner-lease",
	hopOwnerHead:  "owner-head",
	hopOwnerSetup: "owner-setup",
	hopUpstream:   "upstream",
	hopRelay:      "relay",
	hopToCaller:   "to-caller",
}
