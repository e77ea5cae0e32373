// Command releasesign makes the minisign signatures of a release, as
// `minisign -S` would, so that a release needs no minisign binary: GoReleaser
// runs it for every binary, archive, package and the checksum file
// (.goreleaser.yaml). With -G it writes a new key pair, which .ci/run uses
// for a snapshot release with a throwaway key.
//
//	releasesign -G -p deployd.pub -s deployd.key   new pair; the secret key unencrypted
//	releasesign -S -s deployd.key -m FILE [-x SIG] sign FILE into SIG (default FILE.minisig)
//
// A password-protected secret key (minisign -G) is read with the password in
// $MINISIGN_PASSWORD. Signatures are prehashed (BLAKE2b), minisign's default,
// which `minisign -Vm` and `deployd upgrade --signature` verify.
package main

import (
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"aead.dev/minisign"
)

func main() {
	if err := run(os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "releasesign:", err)
		os.Exit(1)
	}
}

func run(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("releasesign", flag.ContinueOnError)
	fs.SetOutput(stderr)
	gen := fs.Bool("G", false, "generate a key pair")
	sign := fs.Bool("S", false, "sign a file")
	pubPath := fs.String("p", "", "public key `FILE` (-G)")
	secPath := fs.String("s", "", "secret key `FILE`")
	msg := fs.String("m", "", "`FILE` to sign (-S)")
	sig := fs.String("x", "", "signature `FILE` (-S; default FILE.minisig)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case *gen && !*sign && *pubPath != "" && *secPath != "":
		return generate(*pubPath, *secPath)
	case *sign && !*gen && *secPath != "" && *msg != "":
		if *sig == "" {
			*sig = *msg + ".minisig"
		}
		return signFile(*secPath, *msg, *sig)
	}
	return errors.New("usage: releasesign -G -p PUB -s SEC | releasesign -S -s SEC -m FILE [-x SIG]")
}

func generate(pubPath, secPath string) error {
	pub, priv, err := minisign.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	pubText, err := pub.MarshalText()
	if err != nil {
		return err
	}
	privText, err := priv.MarshalText()
	if err != nil {
		return err
	}
	if err := os.WriteFile(secPath, append(privText, '\n'), 0o600); err != nil {
		return err
	}
	return os.WriteFile(pubPath, append(pubText, '\n'), 0o644) // with its comment line, as minisign -G writes it
}

func signFile(secPath, msgPath, sigPath string) error {
	keyText, err := os.ReadFile(secPath)
	if err != nil {
		return err
	}
	var priv minisign.PrivateKey
	if minisign.IsEncrypted(keyText) {
		if priv, err = minisign.DecryptKey(os.Getenv("MINISIGN_PASSWORD"), keyText); err != nil {
			return fmt.Errorf("secret key %s (password from $MINISIGN_PASSWORD): %w", secPath, err)
		}
	} else if err := priv.UnmarshalText([]byte(strings.TrimSpace(string(keyText)))); err != nil {
		return fmt.Errorf("secret key %s: %w", secPath, err)
	}
	f, err := os.Open(msgPath)
	if err != nil {
		return err
	}
	defer f.Close()
	r := minisign.NewReader(f)
	if _, err := io.Copy(io.Discard, r); err != nil {
		return fmt.Errorf("read %s: %w", msgPath, err)
	}
	trusted := "timestamp:" + fmt.Sprint(fileTime(f)) + "\tfile:" + filepath.Base(msgPath) + "\thashed"
	untrusted := fmt.Sprintf("signature from minisign secret key %X", priv.ID())
	return os.WriteFile(sigPath, r.SignWithComments(priv, trusted, untrusted), 0o644)
}

// fileTime is the file's modification time in Unix seconds: GoReleaser
// stamps its files with the commit time, so the signature's trusted comment
// is reproducible.
func fileTime(f *os.File) int64 {
	if st, err := f.Stat(); err == nil {
		return st.ModTime().Unix()
	}
	return 0
}
