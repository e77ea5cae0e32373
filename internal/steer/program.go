package steer

import (
	"encoding/binary"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"
)

// ethIPv4 is ETH_P_IP as the program reads sk_reuseport_md.eth_protocol
// (network byte order in a host-order word).
var ethIPv4 = int32(binary.NativeEndian.Uint16([]byte{0x08, 0x00}))

// Offsets in struct sk_reuseport_md (include/uapi/linux/bpf.h).
const (
	mdEthProtocol = 20
	mdHash        = 32
	mdMigratingSk = 48 // struct bpf_sock *, NULL unless migrating
)

// Offsets in struct bpf_sock (include/uapi/linux/bpf.h): for a migrating
// connection the "destination" is its client.
const (
	bsFamily  = 4
	bsDstIP4  = 52
	bsDstIP6w = 56 + 12 // the last word of dst_ip6
)

// program picks the socket of a new (or migrating) connection:
//
//	held:   the Hold socket, if there is one
//	even:   slot = arrivals % active (turns, in arrival order)
//	sticky: slot = mix(client IPv4, or the last word of an IPv6) % active,
//	        the client's address read from the packet or, for a connection
//	        migrating off a closed socket (no packet), from that connection
//	then the first live slot from there on (a crashed worker's socket has
//	left the map: its clients all go to the next one), in the live half
//	(the base map's index, 0 without one).
//
// No live slot: SK_PASS without a choice, the kernel's own hash among the
// group's listening sockets (workers still starting).
//
// Stack: fp-4 a lookup key (0), fp-8 the map index to select, fp-12 the
// client address, fp-16 the arrival counter, fp-20 the live half's first
// index, fp-24 the slot counted.
func program(socks, cfg, counts, base *ebpf.Map) asm.Instructions {
	selectSlot := func(label string) asm.Instructions { // key at fp-8
		return asm.Instructions{
			asm.Mov.Reg(asm.R1, asm.R6).WithSymbol(label),
			asm.LoadMapPtr(asm.R2, socks.FD()),
			asm.Mov.Reg(asm.R3, asm.RFP),
			asm.Add.Imm(asm.R3, -8),
			asm.Mov.Imm(asm.R4, 0),
			asm.FnSkSelectReuseport.Call(),
		}
	}
	var p asm.Instructions
	p = append(p,
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.StoreImm(asm.RFP, -4, 0, asm.Word),
		asm.StoreImm(asm.RFP, -20, 0, asm.Word),
		asm.LoadMapPtr(asm.R1, base.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -4),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "config"),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.Word),
		asm.StoreMem(asm.RFP, -20, asm.R1, asm.Word),
		asm.LoadMapPtr(asm.R1, cfg.FD()).WithSymbol("config"),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -4),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "pass"),
		asm.LoadMem(asm.R7, asm.R0, 0, asm.Word), // active
		asm.LoadMem(asm.R8, asm.R0, 4, asm.Word), // mode
		asm.LoadMem(asm.R9, asm.R0, 8, asm.Word), // held
		// The arrival counter, then +1 (two CPUs may read the same value:
		// a turn taken twice, no harm).
		asm.LoadMem(asm.R1, asm.R0, 12, asm.Word),
		asm.StoreMem(asm.RFP, -16, asm.R1, asm.Word),
		asm.Mov.Imm(asm.R1, 1),
		asm.AddAtomic.Mem(asm.R0, asm.R1, asm.Word, 12),
		asm.JEq.Imm(asm.R9, 0, "pick"),
		asm.StoreImm(asm.RFP, -8, Hold, asm.Word),
	)
	p = append(p, selectSlot("hold")...)
	p = append(p,
		asm.JEq.Imm(asm.R0, 0, "pass"),
		asm.JEq.Imm(asm.R7, 0, "pass").WithSymbol("pick"),
		asm.JGT.Imm(asm.R7, MaxSlots, "pass"), // a bound the verifier can see
		asm.LoadMem(asm.R9, asm.RFP, -16, asm.Word),
		asm.JEq.Imm(asm.R8, int32(Even), "spread"),
		asm.LoadMem(asm.R9, asm.R6, mdHash, asm.Word), // sticky without an address

		asm.Mov.Imm(asm.R2, 12), // IPv4 source address
		asm.LoadMem(asm.R1, asm.R6, mdEthProtocol, asm.Word),
		asm.JEq.Imm(asm.R1, ethIPv4, "load"),
		asm.Mov.Imm(asm.R2, 8+12), // the last word of the IPv6 source
		asm.Mov.Reg(asm.R1, asm.R6).WithSymbol("load"),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, -12),
		asm.Mov.Imm(asm.R4, 4),
		asm.Mov.Imm(asm.R5, 1), // BPF_HDR_START_NET
		asm.FnSkbLoadBytesRelative.Call(),
		asm.JNE.Imm(asm.R0, 0, "migrating"),
		asm.LoadMem(asm.R9, asm.RFP, -12, asm.Word),
		asm.Ja.Label("mix"),
		// A connection migrating off a closed socket comes without a
		// packet: its client is the socket's peer, so that it goes where
		// its client's new connections go. Neither: the hash decides.
		asm.LoadMem(asm.R1, asm.R6, mdMigratingSk, asm.DWord).WithSymbol("migrating"),
		asm.JEq.Imm(asm.R1, 0, "spread"),
		asm.LoadMem(asm.R2, asm.R1, bsFamily, asm.Word),
		asm.LoadMem(asm.R9, asm.R1, bsDstIP6w, asm.Word), // v4-mapped too
		asm.JNE.Imm(asm.R2, unix.AF_INET, "mix"),
		asm.LoadMem(asm.R9, asm.R1, bsDstIP4, asm.Word),
	)
	p = append(p, mix(asm.R9, "mix")...)
	p = append(p,
		asm.Mod.Reg32(asm.R9, asm.R7).WithSymbol("spread"), // first slot to try
		asm.Mov.Imm(asm.R8, 0),                             // slots tried
		asm.JGE.Reg(asm.R8, asm.R7, "pass").WithSymbol("loop"),
		asm.Mov.Reg(asm.R1, asm.R9),
		asm.Add.Reg(asm.R1, asm.R8),
		asm.Mod.Reg32(asm.R1, asm.R7),
		asm.StoreMem(asm.RFP, -24, asm.R1, asm.Word),
		asm.LoadMem(asm.R2, asm.RFP, -20, asm.Word),
		asm.Add.Reg32(asm.R1, asm.R2),
		asm.StoreMem(asm.RFP, -8, asm.R1, asm.Word),
	)
	p = append(p, selectSlot("try")...)
	p = append(p,
		asm.JNE.Imm(asm.R0, 0, "next"),
		// Count the connection in its slot (status shows each worker's),
		// whichever half it is in.
		asm.LoadMapPtr(asm.R1, counts.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -24),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "pass"),
		asm.Mov.Imm(asm.R1, 1),
		asm.AddAtomic.Mem(asm.R0, asm.R1, asm.DWord, 0),
		asm.Ja.Label("pass"),
		asm.Add.Imm(asm.R8, 1).WithSymbol("next"),
		asm.Ja.Label("loop"),
		asm.Mov.Imm(asm.R0, 1).WithSymbol("pass"), // SK_PASS
		asm.Return(),
	)
	return p
}

// mix is a 32-bit integer hash (lowbias32, by Chris Wellons) of r in place
// (r1 is scratch), its first instruction labelled label: every bit of a
// client address moves the slot.
func mix(r asm.Register, label string) asm.Instructions {
	xorShift := func() asm.Instructions {
		return asm.Instructions{asm.Mov.Reg32(asm.R1, r), asm.RSh.Imm32(asm.R1, 16), asm.Xor.Reg32(r, asm.R1)}
	}
	var p asm.Instructions
	p = append(p, xorShift()...)
	p[0] = p[0].WithSymbol(label)
	p = append(p, asm.Mul.Imm32(r, 0x7feb352d))
	p = append(p, asm.Mov.Reg32(asm.R1, r), asm.RSh.Imm32(asm.R1, 15), asm.Xor.Reg32(r, asm.R1))
	p = append(p, asm.Mul.Imm32(r, -2073254261)) // 0x846ca68b
	return append(p, xorShift()...)
}
