package sockdiag

import (
	"net"
	"testing"
	"time"
)

// infoOf dumps the one established socket on local's port (the accepted
// end) with its tcp_info.
func infoOf(t *testing.T, local net.Addr) Socket {
	t.Helper()
	want := local.(*net.TCPAddr).AddrPort()
	socks, err := TCPInfo([]State{Established}, func(s *Socket) bool {
		return s.Local.Port() == want.Port()
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(socks) != 1 || socks[0].Info == nil {
		t.Fatalf("want one established socket with tcp_info at %v, got %+v", want, socks)
	}
	return socks[0]
}

// A connection's tcp_info tells an accepted connection whose request was
// not read (bytes in its receive queue, nothing sent) from one answered.
func TestInfoTellsUnansweredFromAnswered(t *testing.T) {
	l := listen(t, "tcp4", "127.0.0.1:0")
	srv := connect(t, l, 1)[0]
	if s := infoOf(t, l.Addr()); s.Info.DataSegsOut != 0 || s.Info.BytesReceived != 0 || s.RecvQ != 0 {
		t.Fatalf("a fresh connection: %+v %+v", s, *s.Info)
	}
	_ = srv.Close() // leaves established state: the next one is alone
	cli, err := net.DialTimeout("tcp", l.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	l.SetDeadline(time.Now().Add(5 * time.Second))
	srv, err = l.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if _, err := cli.Write([]byte("GET / HTTP/1.1\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	s := infoOf(t, l.Addr())
	for s.RecvQ == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond) // the bytes cross loopback
		s = infoOf(t, l.Addr())
	}
	if s.RecvQ != 18 || s.Info.BytesReceived != 18 || s.Info.DataSegsOut != 0 {
		t.Fatalf("a request not read: RecvQ %d, %+v", s.RecvQ, *s.Info)
	}
	buf := make([]byte, 64)
	if _, err := srv.Read(buf); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Write([]byte("HTTP/1.1 200 OK\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	if s := infoOf(t, l.Addr()); s.RecvQ != 0 || s.Info.DataSegsOut == 0 || s.Info.LastDataSent > s.Info.LastDataRecv {
		t.Fatalf("an answered request: RecvQ %d, %+v", s.RecvQ, *s.Info)
	}
}
