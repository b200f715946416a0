// A relying party built on coreos/go-oidc and golang.org/x/oauth2 (Go), the
// third library that signs in with latchkey in the conformance scenarios
// (tests/it/conformance.rs), beside openid-client (rp.mjs) and Authlib
// (rp.py). Same commands, same JSON in and out:
//
//	oidc-rp-go start  '{"issuer","base","client_id","client_secret"?,"redirect_uri","scope",
//	                    "extra"?,"no_nonce"?,"auth"?}'
//	  -> {"url", "code_verifier", "state", "nonce"}
//	oidc-rp-go finish '{...start's input, "callback", "code_verifier", "state", "nonce",
//	                    "max_age"?, "post_logout_redirect_uri"?}'
//	  -> {"claims", "userinfo", "refreshed", "end_session", "access_token", "id_token", "scope"}
//	oidc-rp-go logout-token '{"issuer","base","client_id","logout_token","alg"?}'
//	  -> {"claims"}: go-oidc's VerifyLogout (Back-Channel Logout 1.0 §2.6)
//
// What it checks is go-oidc's: discovery's issuer, the id_token's signature
// against the JWKS with the algorithm pinned, iss, aud, exp, and at_hash
// (VerifyAccessToken); here, as the library leaves them to the application:
// state, the iss response parameter (RFC 9207), nonce, azp, auth_time
// against max_age, and userinfo's sub. `base` is where latchkey really
// listens: every request to the issuer's origin goes there.
//
// Any refusal prints {"error", "code"} and exits 1.
package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"
)

type input struct {
	Issuer                string            `json:"issuer"`
	Base                  string            `json:"base"`
	ClientID              string            `json:"client_id"`
	ClientSecret          string            `json:"client_secret"`
	RedirectURI           string            `json:"redirect_uri"`
	Scope                 string            `json:"scope"`
	Extra                 map[string]string `json:"extra"`
	NoNonce               bool              `json:"no_nonce"`
	Auth                  string            `json:"auth"`
	Callback              string            `json:"callback"`
	CodeVerifier          string            `json:"code_verifier"`
	State                 string            `json:"state"`
	Nonce                 *string           `json:"nonce"`
	MaxAge                *int64            `json:"max_age"`
	PostLogoutRedirectURI string            `json:"post_logout_redirect_uri"`
	IDTokenAlg            string            `json:"id_token_alg"`
	Alg                   string            `json:"alg"`
	LogoutToken           string            `json:"logout_token"`
}

// toBase sends every request for the issuer's origin to where latchkey listens.
type toBase struct {
	origin, base string
}

func (t toBase) RoundTrip(r *http.Request) (*http.Response, error) {
	u := r.URL.String()
	if strings.HasPrefix(u, t.origin) {
		to, err := url.Parse(t.base + strings.TrimPrefix(u, t.origin))
		if err != nil {
			return nil, err
		}
		r = r.Clone(r.Context())
		r.URL = to
		r.Host = to.Host
	}
	return http.DefaultTransport.RoundTrip(r)
}

func random() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

func fail(code string, err error) {
	out, _ := json.Marshal(map[string]any{"error": err.Error(), "code": code})
	fmt.Println(string(out))
	os.Exit(1)
}

func main() {
	var p input
	if len(os.Args) != 3 || json.Unmarshal([]byte(os.Args[2]), &p) != nil {
		fail("usage", errors.New("oidc-rp-go start|finish|logout-token JSON"))
	}
	origin, err := url.Parse(p.Issuer)
	if err != nil {
		fail("input", err)
	}
	client := &http.Client{
		Timeout:   10 * time.Second,
		Transport: toBase{origin: origin.Scheme + "://" + origin.Host, base: p.Base},
		// The library never follows a redirect here; the test plays the browser.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	ctx := oidc.ClientContext(context.Background(), client)
	provider, err := oidc.NewProvider(ctx, p.Issuer)
	if err != nil {
		fail("discovery", err)
	}
	var meta struct {
		EndSession string `json:"end_session_endpoint"`
	}
	if err := provider.Claims(&meta); err != nil {
		fail("discovery", err)
	}
	style := oauth2.AuthStyleInHeader
	if p.Auth == "post" {
		style = oauth2.AuthStyleInParams
	}
	scope := p.Scope
	if scope == "" {
		scope = "openid email profile"
	}
	endpoint := provider.Endpoint()
	endpoint.AuthStyle = style
	conf := oauth2.Config{
		ClientID:     p.ClientID,
		ClientSecret: p.ClientSecret,
		RedirectURL:  p.RedirectURI,
		Endpoint:     endpoint,
		Scopes:       strings.Fields(scope),
	}
	alg := p.IDTokenAlg
	if alg == "" {
		alg = "EdDSA"
	}
	switch os.Args[1] {
	case "start":
		verifier := oauth2.GenerateVerifier()
		state := random()
		opts := []oauth2.AuthCodeOption{oauth2.S256ChallengeOption(verifier)}
		var nonce *string
		if !p.NoNonce {
			n := random()
			nonce = &n
			opts = append(opts, oidc.Nonce(n))
		}
		for k, v := range p.Extra {
			opts = append(opts, oauth2.SetAuthURLParam(k, v))
		}
		out, _ := json.Marshal(map[string]any{
			"url": conf.AuthCodeURL(state, opts...), "code_verifier": verifier, "state": state, "nonce": nonce,
		})
		fmt.Println(string(out))
	case "finish":
		finish(ctx, p, provider, conf, alg, meta.EndSession)
	case "logout-token":
		if p.Alg != "" {
			alg = p.Alg
		}
		verifier := provider.Verifier(&oidc.Config{ClientID: p.ClientID, SupportedSigningAlgs: []string{alg}})
		token, err := verifier.VerifyLogout(ctx, p.LogoutToken)
		if err != nil {
			fail("logout_token", err)
		}
		var claims map[string]any
		if err := token.Claims(&claims); err != nil {
			fail("logout_token", err)
		}
		out, _ := json.Marshal(map[string]any{"claims": claims})
		fmt.Println(string(out))
	default:
		fail("usage", fmt.Errorf("unknown command %s", os.Args[1]))
	}
}

func finish(ctx context.Context, p input, provider *oidc.Provider, conf oauth2.Config, alg, endSession string) {
	cb, err := url.Parse(p.Callback)
	if err != nil {
		fail("callback", err)
	}
	q := cb.Query()
	if e := q.Get("error"); e != "" {
		fail(e, errors.New(q.Get("error_description")))
	}
	if q.Get("state") != p.State {
		fail("state", errors.New("state mismatch"))
	}
	var issuer struct {
		Issuer string `json:"issuer"`
	}
	_ = provider.Claims(&issuer)
	if q.Get("iss") != issuer.Issuer {
		fail("iss", errors.New("the iss response parameter is missing or another issuer's (RFC 9207)"))
	}
	token, err := conf.Exchange(ctx, q.Get("code"), oauth2.VerifierOption(p.CodeVerifier))
	if err != nil {
		fail("token", err)
	}
	raw, ok := token.Extra("id_token").(string)
	if !ok {
		fail("id_token", errors.New("no id_token"))
	}
	verifier := provider.Verifier(&oidc.Config{ClientID: p.ClientID, SupportedSigningAlgs: []string{alg}})
	idToken, err := verifier.Verify(ctx, raw)
	if err != nil {
		fail("id_token", err)
	}
	// at_hash is optional in the code flow (Core 3.1.3.6); checked when present.
	if idToken.AccessTokenHash != "" {
		if err := idToken.VerifyAccessToken(token.AccessToken); err != nil {
			fail("at_hash", err)
		}
	}
	var claims map[string]any
	if err := idToken.Claims(&claims); err != nil {
		fail("id_token", err)
	}
	got, has := claims["nonce"].(string)
	switch {
	case p.Nonce == nil && has:
		fail("nonce", errors.New("a nonce in the id_token, none in the request"))
	case p.Nonce != nil && got != *p.Nonce:
		fail("nonce", errors.New("nonce mismatch"))
	}
	if azp, has := claims["azp"].(string); has && azp != p.ClientID {
		fail("azp", errors.New("azp is another client"))
	}
	if p.MaxAge != nil {
		at, has := claims["auth_time"].(float64)
		if !has || time.Since(time.Unix(int64(at), 0)) > time.Duration(*p.MaxAge+5)*time.Second {
			fail("auth_time", errors.New("auth_time missing or older than max_age"))
		}
	}
	info, err := provider.UserInfo(ctx, oauth2.StaticTokenSource(token))
	if err != nil {
		fail("userinfo", err)
	}
	if info.Subject != idToken.Subject {
		fail("userinfo", errors.New("userinfo's sub is not the id_token's (Core 5.3.2)"))
	}
	var userinfo map[string]any
	if err := info.Claims(&userinfo); err != nil {
		fail("userinfo", err)
	}
	var refreshed any
	if token.RefreshToken != "" {
		old := *token
		old.Expiry = time.Now().Add(-time.Minute) // due: the source refreshes
		next, err := conf.TokenSource(ctx, &old).Token()
		if err != nil {
			fail("refresh", err)
		}
		refreshed = map[string]any{"access_token": next.AccessToken, "refresh_token": next.RefreshToken}
	}
	end := url.Values{"id_token_hint": {raw}}
	if p.PostLogoutRedirectURI != "" {
		end.Set("post_logout_redirect_uri", p.PostLogoutRedirectURI)
		end.Set("state", "bye")
	}
	scope, _ := token.Extra("scope").(string)
	out, _ := json.Marshal(map[string]any{
		"claims":       claims,
		"userinfo":     userinfo,
		"refreshed":    refreshed,
		"end_session":  endSession + "?" + end.Encode(),
		"access_token": token.AccessToken,
		"id_token":     raw,
		"scope":        scope,
	})
	fmt.Println(string(out))
}
